#!/usr/bin/env bash
# The device check: decode tok/s at batch 1, 16 and 64 (and the fraction of the HBM-bandwidth bound), TTFT, and the
# constrained against the unconstrained step time, for the default model and a ~1.5B random-weight dense config in
# bfloat16, on the accelerator JAX finds. Installs nothing and needs no network: run it after `scripts/bootstrap.sh`
# (the venv and the cached default model). Under 8 minutes on one accelerator; `--smoke` is a reduced CPU run
# (SmolLM2, batches 1 and 2), the one CI runs.
# Usage: bash bench/device_check.sh [--smoke] [--help] [options of bench/device_check.py]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"  # the venv scripts/bootstrap.sh made
[ -x "$PYTHON" ] || PYTHON=python3
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
  exec "$PYTHON" bench/device_check.py --help
fi
exec timeout 480 "$PYTHON" bench/device_check.py "$@"
