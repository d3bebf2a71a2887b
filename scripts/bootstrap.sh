#!/usr/bin/env bash
# Set up jaxchat on a fresh machine: a virtual environment in .venv, the package with its
# test extras, and the offline assets (models, chat templates) in the cache.
# Usage: bash scripts/bootstrap.sh [--no-assets]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# xgrammar imports torch; the CPU build 2.13.0 is much smaller than the default CUDA one.
.venv/bin/python -m pip install -q --disable-pip-version-check "torch==2.13.0"
.venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"
if [ "${1:-}" != "--no-assets" ]; then
  .venv/bin/python -m jaxchat.assets fetch
  # The GGUF models' converted weights, tokenizers and grammar tables, so that a first start maps and reads them.
  .venv/bin/python -m jaxchat.prepare
fi
