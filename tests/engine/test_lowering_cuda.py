"""`jaxchat lower --platform cuda` (issue 48): jaxlib lowers the engine's programs for `cuda` on a CPU-only host,
the jnp attention path, pages of 16 tokens, a GPU's memory (`chips.GPUS`); the TPU kernel is refused there."""

from __future__ import annotations

import json
from pathlib import Path

from jaxchat import cli

CONFIG = Path(__file__).resolve().parents[1] / "data" / "tpu_configs" / "qwen2.5-0.5b.json"
ARGS = ["lower", "--model", str(CONFIG), "--platform", "cuda", "--devices", "1", "--max-batch", "4",
        "--max-context", "1024", "--programs", "largest"]


def test_every_kind_of_program_lowers_for_cuda_with_the_jnp_path(capsys):
    assert cli.main([*ARGS, "--chip", "h100"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    out = json.loads(lines[-1])
    assert out["platform"] == "cuda" and out["chip"] == "h100" and out["hbm_bytes"] == 80 * 10**9
    assert out["lowered"] == 3 and out["errors"] == [] and out["fits"]  # decode, ragged, sample: the largest each
    assert out["attention"] == "xla" and out["page_size"] == 16 and out["vmem_bytes"] == 0
    assert any("lowered for cuda" in line for line in lines) and not any("VMEM" in line for line in lines)


def test_a_tpu_chip_or_the_tpu_kernel_on_cuda_is_a_clear_error(capsys):
    assert cli.main([*ARGS, "--chip", "v5e"]) == 2
    assert "chip 'v5e' on cuda: choose one of h100, h200, a100, l4" in capsys.readouterr().out
    assert cli.main([*ARGS, "--chip", "h100", "--attention", "pallas"]) == 2
    assert "the Pallas kernel is a TPU (Mosaic) kernel" in capsys.readouterr().out
