"""bench/device_check.sh: its usage, and its reduced run on CPU (the figures on an accelerator are recorded in
docs/benchmarks.md when one was at hand)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "device_check.sh"
ENV = {**os.environ, "PYTHON": sys.executable}


def test_help_prints_the_usage():
    out = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120, env=ENV)
    assert out.returncode == 0, out.stderr
    assert "Usage: bash bench/device_check.sh" in out.stdout and "--smoke" in out.stdout


@pytest.mark.slow
def test_smoke_run_on_cpu_prints_every_figure():
    from jaxchat.assets import AssetError, asset_path

    try:
        asset_path("smollm2-135m-instruct-q4_1.gguf")
    except AssetError as e:
        pytest.skip(str(e))
    out = subprocess.run(["bash", str(SCRIPT), "--smoke"], capture_output=True, text=True, cwd=ROOT, timeout=600, env=ENV)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    text = out.stdout
    for pattern in (r"decode batch +1: +[\d.]+ tok/s +\(\d+% of the bandwidth bound\)", r"decode batch +2: +[\d.]+ tok/s",
                    r"TTFT, 64-token prompt, batch 1: [\d.]+ ms", r"JSON schema on every row [\d.]+ ms \([\d.]+x\)",
                    r"^device check: ok$"):
        assert re.search(pattern, text, re.M), (pattern, text)
