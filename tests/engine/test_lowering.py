"""`jaxchat lower` (issue 48): TPU slices planned from a config and every program lowered for `tpu` on fake CPU
devices. The lowering cases run once, in one subprocess with 8 devices (`lower_cases.py`), shared by the tests
below; the plan's arithmetic and the kernel's block rules are checked in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

from jaxchat.engine import attention_tpu, chips, slice_plan
from jaxchat.engine.engine import INTERPRETER_ON_A_MESH, attention_choice
from jaxchat.models import ModelConfig

HERE = Path(__file__).resolve().parent
CONFIGS = HERE.parent / "data" / "tpu_configs"
ROOT = HERE.parents[1]


def _env() -> dict:
    return {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> dict:
    dest = tmp_path_factory.mktemp("lower") / "cases.json"
    proc = subprocess.run([sys.executable, str(HERE / "lower_cases.py"), str(dest)], env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(dest.read_text())


def _summary(case: dict) -> dict:
    return json.loads(case["lines"][-1])


KEYS = {"programs", "lowered", "per_chip_bytes", "hbm_bytes", "vmem_bytes", "vmem_limit_bytes", "page_size",
        "kv_pages"}


def test_every_program_of_qwen3_8b_lowers_for_v5e_4_with_the_kernel_under_shard_map(cases):
    case = cases["qwen3-8b-v5e-4"]
    out = _summary(case)
    assert case["rc"] == 0 and KEYS <= out.keys()
    assert out["programs"] == out["lowered"] == 23 and out["errors"] == []  # 7 decode, 9 ragged, 7 samplers
    assert out["attention"] == "pallas" and out["page_size"] == 256
    assert out["per_chip_bytes"] <= out["hbm_bytes"] == 16 << 30
    assert 0 < out["vmem_bytes"] <= out["vmem_limit_bytes"] // 2
    assert out["vmem_bytes"] > chips.CHIPS["v5e"].default_scoped_vmem_bytes  # why the limit is passed
    # 64 rows of 32k tokens do not fit 4 chips: the pool is what memory holds, sharded (a quarter a chip)
    assert 1 < out["kv_pages"] < 64 * 128
    per_token = 36 * 2 * 8 * 128 * 2
    assert out["bytes"]["kv_pool"] == out["kv_pages"] * 256 * per_token // 4
    assert sum(line.split()[1] == "lowered" for line in case["lines"][1:24]) == 23


def test_qwen3_8b_on_v6e_8_and_the_moe_shape(cases):
    dense, moe = _summary(cases["qwen3-8b-v6e-8"]), _summary(cases["qwen3-moe-v6e-8"])
    assert cases["qwen3-8b-v6e-8"]["rc"] == 0 and dense["attention"] == "pallas"
    assert dense["lowered"] == 3 and dense["per_chip_bytes"] <= dense["hbm_bytes"]
    assert cases["qwen3-moe-v6e-8"]["rc"] == 0 and moe["lowered"] == 3 and moe["fits"]
    # 4 kv heads on 8 chips: the jnp path, and the plan says why
    assert moe["attention"] == "xla"
    assert any("4 kv heads do not divide over 8 devices" in line for line in cases["qwen3-moe-v6e-8"]["lines"])


def test_asked_for_pallas_where_heads_do_not_divide_and_head_dim_64_take_the_jnp_path(cases):
    for name in ("qwen3-8b-pallas-8-of-4-heads", "head-dim-64-v5e-4"):
        assert cases[name]["rc"] == 0 and _summary(cases[name])["attention"] == "xla"
    assert any("head_dim [64]" in line for line in cases["head-dim-64-v5e-4"]["lines"])


def test_a_two_kv_head_1_5b_on_v5e_8_lowers_as_8_replicas_of_one_chip(cases):
    """Qwen2.5-1.5B's shape (2 kv heads) with `--data-parallel 8`: each chip a whole replica, the kernel's path
    on one chip (the heads need not divide), the weights whole on each chip; the same by default."""
    case = cases["qwen2.5-1.5b-dp8-v5e-8"]
    out = _summary(case)
    assert case["rc"] == 0 and KEYS <= out.keys() and out["fits"]
    assert out["data_parallel"] == 8 and out["devices"] == 8 and out["attention"] == "pallas"
    assert out["programs"] == out["lowered"] and out["errors"] == []
    weights = 28 * (1536 * (12 + 2 * 2) * 128 + 12 * 128 * 1536 + 3 * 1536 * 8960) + 151936 * 1536  # no biases
    assert weights * 2 <= out["bytes"]["weights"] < weights * 2 * 1.02  # bf16, a whole replica on every chip
    per_token = 28 * 2 * 2 * 128 * 2
    assert out["bytes"]["kv_pool"] >= out["kv_pages"] * out["page_size"] * per_token  # one replica's pool
    assert any("8 data-parallel replicas of 1 chip" in line for line in case["lines"])
    default = cases["qwen2.5-1.5b-v5e-8"]
    assert default["rc"] == 0 and _summary(default)["data_parallel"] == 8
    assert any("2 kv heads do not divide 8 chips" in line for line in default["lines"])


@pytest.mark.parametrize("name", ["qwen3-8b-v5e-1", "llama-70b-v5e-1"])
def test_a_model_that_cannot_fit_is_refused_with_what_would_fit(cases, name):
    case = cases[name]
    out = _summary(case)
    assert case["rc"] == 1 and not out["fits"] and out["lowered"] == 0
    assert "GiB over" in out["message"] and "--devices" in out["message"]
    assert not any("Traceback" in line for line in case["lines"])


def test_the_kernel_under_shard_map_gives_one_devices_outputs_and_pool(cases):
    result = cases["shard_map"]
    assert result["out_abs_max"] > 0.1
    assert result["out_max_diff"] < 1e-5 and result["pool_max_diff"] == 0.0


def test_the_command_line_gets_its_devices_itself_and_ends_with_json():
    proc = subprocess.run([sys.executable, "-m", "jaxchat", "lower", "--model", str(CONFIGS / "llama-70b.json"),
                           "--chip", "v5e", "--devices", "2"], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["devices"] == 2 and "does not fit 2 x v5e" in last["message"] and "Traceback" not in proc.stderr


def test_the_kernel_tiles_bf16_pools_by_the_bf16_rule():
    assert attention_tpu.tiling_problem(12, 12, jnp.float32, jnp.float32) is None
    assert "multiple of 8" in attention_tpu.tiling_problem(12, 12, jnp.bfloat16, jnp.bfloat16)
    assert attention_tpu.tiling_problem(32, 8, jnp.bfloat16, jnp.bfloat16) is None
    assert attention_tpu.tiling_problem(4, 1, jnp.bfloat16, jnp.bfloat16) is None


def test_attention_choice_falls_back_where_heads_do_not_divide():
    cfg = ModelConfig(family="qwen3", vocab_size=64, hidden_size=64, intermediate_size=64, num_layers=1,
                      num_heads=8, num_kv_heads=2, head_dim=128)
    assert attention_choice("auto", cfg, "tpu", 2) == ("pallas", None)
    chosen, why = attention_choice("pallas", cfg, "tpu", 4)
    assert chosen == "xla" and "do not divide over 4" in why
    assert attention_choice("auto", cfg, "cpu", 1)[0] == "xla"
    assert attention_choice("pallas", cfg, "cpu", 1)[0] == "pallas"  # under the interpreter
    assert attention_choice("pallas", cfg, "cpu", 2) == ("xla", INTERPRETER_ON_A_MESH)


def test_blocks_fit_half_the_vmem_limit_and_pages_follow_the_kernels_guidance():
    v5e = chips.chip("v5e")
    args = (jnp.bfloat16, jnp.bfloat16, 8, 2, 128, 256, 2048, 128)
    pages, queries = attention_tpu.block_sizes(*args, chip=v5e, vmem_limit_bytes=4 << 20)
    assert 2 * attention_tpu.vmem_bytes(*args[:6], pages, queries) <= 4 << 20
    assert pages < attention_tpu.block_sizes(*args, chip=v5e)[0]
    assert [attention_tpu.page_size_for(n) for n in (1024, 4096, 32768)] == [128, 256, 256]
    with pytest.raises(ValueError, match="choose one of"):
        chips.chip("v4")


def test_tpu_bytes_pads_the_minor_tiles():
    assert slice_plan.tpu_bytes((4096, 8, 6, 128), jnp.bfloat16) == 4096 * 8 * 16 * 128 * 2
    assert slice_plan.tpu_bytes((100, 256, 4, 128), jnp.bfloat16) == 100 * 256 * 4 * 128 * 2
    assert slice_plan.tpu_bytes((64,), jnp.float32) == 128 * 4
    fit = slice_plan.fit_pages(hbm_bytes=16 << 30, weights=17 << 30, state=0, temporaries=0, page_bytes=1 << 20,
                               fixed=0, page_size=256, max_batch=1, max_context=4096, devices=1, chip="v5e")
    assert not fit.fits and "GiB over" in fit.message and "--devices 2" in fit.message
    # 512 rows of 128k tokens in pages of 256: the kernel's page tables would fill the chip's SMEM
    assert slice_plan.kernel_smem(512, 512) > slice_plan.SMEM_SHARE * chips.chip("v5p").smem_bytes
    assert slice_plan.kernel_smem(64, 128) < 64 << 10


def test_no_device_holds_more_than_its_share_during_start_up_and_the_weights_once(cases):
    """4 devices, the kernel's path: params placed sharded, the per-layer buffers replacing the stacked ones one
    tensor at a time, the pool created in place: each device's bytes at every point of start-up stay within a
    quarter of the weights, of the largest stacked tensor and of the pool (plus the small replicated state)."""
    mem = cases["memory"]
    assert "shards=4" in mem["backend"]
    bound = (mem["weights"] + mem["largest_stacked"] + mem["pool"]) // 4 + (256 << 10)
    assert len(mem["peaks"]) > 5 and max(mem["peaks"]) <= bound, (mem["peaks"], bound)
    assert mem["peaks"][-1] >= (mem["weights"] + mem["pool"]) // 4  # the measurement sees the shards
    assert mem["pools_whole_on_a_device"] == [] and mem["stacked_alive"] == []


def test_the_setup_scripts_kernel_check_passes_under_the_interpreter():
    import jax

    from jaxchat.engine.kernel_check import TOLERANCE, kernel_error
    from jaxchat.engine.pallas_interpret import interpret_ragged_kernel

    with interpret_ragged_kernel():
        assert kernel_error(jax.devices()[0]) < TOLERANCE
