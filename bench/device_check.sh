#!/usr/bin/env bash
# The device check: on one chip, then on all chips, each attention path that runs there (xla; pallas on TPU):
# per-program compile time, memory_stats() after start-up, decode tok/s at batch 1, 16 and 64 (and the fraction of
# all the run's chips' HBM-bandwidth bound), TTFT, the constrained against the unconstrained step time, and pallas
# against xla, for the default model and a ~1.5B random-weight dense config in bfloat16, on the accelerator JAX
# finds. Installs nothing and needs no network: run it after `scripts/bootstrap.sh` (the venv and the cached
# default model). Stopped after DEVICE_CHECK_TIMEOUT seconds (900); `--smoke` is a reduced CPU run (SmolLM2,
# batches 1 and 2), the one CI runs.
# Usage: bash bench/device_check.sh [--smoke] [--help] [options of bench/device_check.py]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"  # the venv scripts/bootstrap.sh made
[ -x "$PYTHON" ] || PYTHON=python3
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
  exec "$PYTHON" bench/device_check.py --help
fi
exec timeout "${DEVICE_CHECK_TIMEOUT:-900}" "$PYTHON" bench/device_check.py "$@"
