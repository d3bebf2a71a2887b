#!/usr/bin/env bash
# The test command: every test, in two pytest runs. First all but the `serial` ones on 2 workers
# (pytest-xdist; each test file stays on one worker, so module fixtures are built once; files are handed
# out in the order tests/conftest.py sorts them, the longest first), then the
# `serial` ones (wall-time bounds, compile counts on a shared service, signals; see
# tests/conftest.py) alone. Extra arguments go to both runs. Exits non-zero when a test fails
# or when neither run collected a test.
# Usage: bash scripts/test.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
WORKERS="${JAXCHAT_TEST_WORKERS:-2}"
# One JAX persistent compilation cache for every test process and the servers and kernels they start: the
# same programs (the default model's buckets, the tiny test models') are compiled once per run, not once
# per process. Compile counters still count cache hits (jaxchat/engine/compiles.py).
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-${JAXCHAT_CACHE:-$HOME/.cache/jaxchat}/jax-compilation-cache}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-0}"
export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="${JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES:-0}"
# Per-file wall times of each run (tests/file_times.py), merged into one table at the end.
TIMES="${JAXCHAT_TEST_TIMES_DIR:-.test-times}"
mkdir -p "$TIMES"
rm -f "$TIMES"/parallel.json "$TIMES"/serial.json
started=$(date +%s)
JAXCHAT_TEST_TIMES="$TIMES/parallel.json" .venv/bin/python -m pytest -m "not serial" -n "$WORKERS" --dist loadfile \
  --no-loadscope-reorder "$@"
parallel=$?
# With no arguments the serial pass collects only the paths that hold serial tests (tests/serial_paths.py).
if [ "$#" -eq 0 ]; then
  mapfile -t serial_args < <(.venv/bin/python -m tests.serial_paths)
else
  serial_args=("$@")
fi
JAXCHAT_TEST_TIMES="$TIMES/serial.json" .venv/bin/python -m pytest -m serial "${serial_args[@]}"
alone=$?
runs=()
for f in "$TIMES"/parallel.json "$TIMES"/serial.json; do [ -f "$f" ] && runs+=("$f"); done
if [ "${#runs[@]}" -gt 0 ]; then
  .venv/bin/python -m tests.file_times --top 25 "${runs[@]}" | tee "$TIMES/table.md"
fi
echo "scripts/test.sh: $(( $(date +%s) - started )) s of wall time for both pytest runs"
if [ "$parallel" -eq 5 ] && [ "$alone" -eq 5 ]; then exit 5; fi
for s in "$parallel" "$alone"; do
  if [ "$s" -ne 0 ] && [ "$s" -ne 5 ]; then exit "$s"; fi
done
exit 0
