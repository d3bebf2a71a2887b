#!/usr/bin/env bash
# The test command: every test, in two pytest runs. First all but the `serial` ones on 2 workers
# (pytest-xdist; each test file stays on one worker, so module fixtures are built once), then the
# `serial` ones (wall-time bounds, compile counts on a shared service, signals; see
# tests/conftest.py) alone. Extra arguments go to both runs. Exits non-zero when a test fails
# or when neither run collected a test.
# Usage: bash scripts/test.sh [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/.."
WORKERS="${JAXCHAT_TEST_WORKERS:-2}"
.venv/bin/python -m pytest -m "not serial" -n "$WORKERS" --dist loadfile "$@"
parallel=$?
.venv/bin/python -m pytest -m serial "$@"
alone=$?
if [ "$parallel" -eq 5 ] && [ "$alone" -eq 5 ]; then exit 5; fi
for s in "$parallel" "$alone"; do
  if [ "$s" -ne 0 ] && [ "$s" -ne 5 ]; then exit "$s"; fi
done
exit 0
