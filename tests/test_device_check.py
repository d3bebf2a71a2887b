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
    for pattern in (r"^== smollm2-135m \(smoke\) on 1 cpu chip\(s\): .*attention xla, ready in \d+ s ==$",
                    r"^compile \(s\), 3 programs, [\d.]+ s in all: decode/2 [\d.]+, ragged/64/2 [\d.]+, sample/2 [\d.]+$",
                    r"^memory_stats: not reported on cpu$", r"pallas not run: pallas is a TPU kernel",
                    r"decode batch +1: +[\d.]+ tok/s +\(\d+% of the bandwidth bound\)", r"decode batch +2: +[\d.]+ tok/s",
                    r"TTFT, 64-token prompt, batch 1: [\d.]+ ms", r"JSON schema on every row [\d.]+ ms \([\d.]+x\)",
                    r"^device check: ok$"):
        assert re.search(pattern, text, re.M), (pattern, text)


class FakeDevice:
    def __init__(self, platform: str, stats: dict | None) -> None:
        self.platform, self.stats = platform, stats

    def memory_stats(self):
        return self.stats

    def __str__(self) -> str:
        return f"{self.platform}:0"


def test_one_chip_then_all_and_where_pallas_runs():
    sys.path.insert(0, str(ROOT))
    from bench import device_check
    from jaxchat.models import ModelConfig

    assert device_check.chip_counts(1) == [1] and device_check.chip_counts(8) == [1, 8]
    qwen3 = ModelConfig(**device_check.QWEN3_1_7B)
    dense = ModelConfig(**device_check.DENSE_1_5B)  # 2 kv heads
    assert device_check.attentions(qwen3, "tpu", 8, "bfloat16") == (["xla", "pallas"], None)
    assert device_check.attentions(dense, "tpu", 1, "bfloat16") == (["xla", "pallas"], None)
    paths, why = device_check.attentions(dense, "tpu", 4, "bfloat16")
    assert paths == ["xla"] and "2 kv heads do not divide over 4 devices" in why
    assert device_check.attentions(qwen3, "gpu", 1, "bfloat16")[0] == ["xla"]
    gib = 1 << 30
    tpu = FakeDevice("tpu", {"bytes_in_use": 3 * gib, "peak_bytes_in_use": 4 * gib, "bytes_limit": 16 * gib})
    assert device_check.memory_lines([tpu]) == ["memory_stats tpu:0: in use 3.00 GiB, peak 4.00 GiB of 16.00 GiB"]
    assert device_check.memory_lines([FakeDevice("cpu", None)]) == ["memory_stats: not reported on cpu"]
