"""Int8 (W8A8) weights: the matmul against numpy within the quantisation bound, every family's int8 logits
against fp32, int8 orbax checkpoints, the engine (masking, no recompiles) and sharding on an int8 model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxchat.models import FAMILIES, load_model
from jaxchat.models import quantize as quantize_mod
from jaxchat.models.quant import Int8Weight, qeinsum, quantize_weight

from .paged import PagedRows

ROOT = Path(__file__).resolve().parents[2]
PROMPT = np.random.default_rng(0).integers(0, 256, (1, 64)).astype(np.int32)


def logits(model, params):
    """The model's fp32 logits [T, V] over PROMPT in one paged step over zeroed pools, from one jitted forward
    per model and params structure (`PagedRows` compiles at XLA's lowest optimisation level: the same ops)."""
    if id(model) not in _ROWS:  # the model is kept alive beside its rows: its id is never reused
        rows = PagedRows(model, 1, PROMPT.shape[1])
        _ROWS[id(model)] = (model, rows, rows.pools)
    _, rows, zeros = _ROWS[id(model)]
    rows.params, rows.pools = params, zeros
    return rows(PROMPT, np.arange(PROMPT.shape[1])[None])[0]


_ROWS: dict = {}


def half_step_noise(params, q, seed: int = 1):
    """The fp32 params with every weight that int8 quantises (in q) moved by uniform noise of up to half its
    int8 step: a float model as far from the original as the int8 weights are, element by element."""
    rng = np.random.default_rng(seed)

    def noisy(w, qw):
        if not isinstance(qw, Int8Weight):
            return w
        step = np.asarray(qw.scale)
        return jnp.asarray(np.asarray(w) + step * rng.uniform(-0.5, 0.5, w.shape).astype(np.float32))

    return jax.tree.map(noisy, params, q, is_leaf=lambda x: isinstance(x, Int8Weight))


K, M = 48, 16


@jax.jit
def _int8_both_ways(x, w):
    qw = quantize_weight(w, (0,))
    return qeinsum("nk,km->nm", x, qw), qeinsum("km,nk->mn", qw, x).T  # the MLP's feature-major form too


@settings(max_examples=30, deadline=None)
@given(rows=st.sampled_from([1, 4]), k=st.integers(1, K), seed=st.integers(0, 2**31 - 1),
       outlier=st.floats(1.0, 100.0))
def test_int8_matmul_within_the_quantisation_bound(rows, k, seed, outlier):
    """With x^ = sx q_x (|x - x^| <= sx / 2 per element, sx = absmax of the row / 127) and w^ likewise per
    output channel (sw), |x^ w^ - x w| <= sum_i (|x_i| sw / 2 + |w_i| sx / 2 + sx sw / 4), plus float32
    rounding of the int32 sum's rescale (relative 1e-6 of sum |x_i w_i|). Shapes are fixed (one compile per row
    count); features past k are zero. One row also checks the padding to two rows."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, K)).astype(np.float32)
    x[:, rng.integers(0, k)] *= outlier  # an outlier feature, as real activations have
    x[:, k:] = 0.0
    w = rng.standard_normal((K, M)).astype(np.float32) * rng.uniform(0.01, 3.0, (1, M)).astype(np.float32)
    got, got_t = (np.asarray(a) for a in _int8_both_ways(jnp.asarray(x), jnp.asarray(w)))
    sx = np.abs(x).max(1, keepdims=True) / 127  # [n, 1]
    sw = np.abs(w).max(0, keepdims=True) / 127  # [1, M]
    bound = np.abs(x) @ np.broadcast_to(sw / 2, w.shape) + sx / 2 * np.abs(w[:k]).sum(0, keepdims=True) + k * sx * sw / 4
    ref = x.astype(np.float64) @ w.astype(np.float64)
    slack = 1e-6 * (np.abs(x) @ np.abs(w)) + 1e-30
    assert np.all(np.abs(got - ref) <= bound * 1.0001 + slack)
    np.testing.assert_allclose(got_t, got, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_int8_top1_agrees_with_fp32(family, tiny_dirs):
    """Top-1 agreement with fp32 over a 64-token prompt: >= 95%, or, where weight noise of half an int8 step
    already moves the fp32 model's top-1 more than that (tiny random models have near-tied logits and, with
    experts, near-tied routing), within 5 points of that noise's own agreement."""
    model = load_model(tiny_dirs[family][0], "float32")
    ref = logits(model, model.params).argmax(-1)
    q = quantize_mod.quantize_params(model.config, model.params)
    agree = float(np.mean(logits(model, q).argmax(-1) == ref))
    noise = float(np.mean(logits(model, half_step_noise(model.params, q)).argmax(-1) == ref))
    print(f"{family}: int8 {agree:.1%}, fp32 + half-step weight noise {noise:.1%}")
    assert agree >= min(0.95, noise - 0.05), f"{family}: int8 top-1 agrees with fp32 on {agree:.1%} of positions"


def test_int8_orbax_checkpoint_loads_without_requantising(tiny_dirs, tmp_path, monkeypatch):
    """An int8 model saved to orbax restores its int8 values and scales as stored (quantising is patched to
    fail) and gives the logits of quantising at load."""
    from jaxchat.models.load import save_orbax

    at_load = load_model(tiny_dirs["qwen3"][0], "float32", quantize="int8")
    save_orbax(at_load, tmp_path / "ckpt")

    def refuse(*a, **k):
        raise AssertionError("re-quantised")

    monkeypatch.setattr(quantize_mod, "_quantize", refuse)
    monkeypatch.setattr(quantize_mod, "quantize_weight", refuse)
    restored = load_model(tmp_path / "ckpt", "float32")
    assert restored.quantize == "int8"
    assert load_model(tmp_path / "ckpt", "float32", quantize="int8").quantize == "int8"  # kept as stored
    flat_a, tree_a = jax.tree.flatten(at_load.params)
    flat_b, tree_b = jax.tree.flatten(restored.params)
    assert tree_a == tree_b and sum(isinstance(x, Int8Weight) for x in jax.tree.leaves(
        restored.params, is_leaf=lambda x: isinstance(x, Int8Weight))) > 0
    for a, b in zip(flat_a, flat_b, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(logits(restored, restored.params), logits(at_load, at_load.params))


def test_int8_engine_masked_decoding_without_recompiles(tmp_path):
    """The engine on an int8 model: a grammar mask keeps every token inside it, batches stay isolated and
    nothing compiles after warm-up."""
    from jaxchat.engine.compiles import compile_count
    from jaxchat.engine.engine import Engine
    from jaxchat.engine.types import GenerationRequest, SamplingParams
    from tests.engine.helpers import ScriptedConstraint
    from tests.engine.test_real_model import greedy, isolation_plan, make_checkpoint, run_plan

    model = load_model(make_checkpoint(tmp_path / "ckpt"), "float32", quantize="int8")
    engine = Engine(model, max_batch=4, max_context=64, start=False, decode_rows=(4,), max_step_tokens=32)
    prompt = [11, 12, 13, 14, 15, 16, 17]
    alone = run_plan(engine, {0: [("submit", greedy("p", prompt, 12))]})["p"]
    before = compile_count()
    masked = GenerationRequest([5, 6, 7], SamplingParams(max_tokens=8, ignore_eos=True),
                               ScriptedConstraint(range(97, 123)), "m")
    plan = isolation_plan(prompt, 12)
    plan[3] = [("submit", masked)]
    out = run_plan(engine, plan)
    assert out["p"] == alone
    assert len(out["m"]) == 8 and all(97 <= t < 123 for t in out["m"])
    assert engine.stats().compiles_on_request_path == 0 and compile_count() == before
    engine.shutdown()


SHARDED = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from jaxchat.engine.step import make_mesh
    from jaxchat.models import load_model
    from tests.models.paged import PagedRows
    prompt = np.arange(11, 43, dtype=np.int32)[None]
    pos = np.arange(32)[None]
    out = {}
    for n in (1, 8):
        mesh = make_mesh(jax.devices()[:n])
        model = load_model(sys.argv[1], "float32", mesh, quantize="int8")
        out[n] = PagedRows(model, 1, 32).place(mesh)(prompt, pos)[0].tolist()  # the pools placed as the engine's
        qkv = model.params["layers"]["attn"]["qkv"]
        out[f"specs{n}"] = [str(qkv.values.sharding.spec), str(qkv.scale.sharding.spec)]
    print(json.dumps(out))
""")


def test_int8_sharded_over_8_fake_devices_equals_unsharded(tmp_path):
    """An int8 model's logits on 8 fake CPU devices equal one device's; the scales shard with their channels
    (the kv-head axis of qkv over 'tp')."""
    from tests.engine.test_real_model import make_checkpoint

    ckpt = make_checkpoint(tmp_path / "ckpt")
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", SHARDED, str(ckpt)], check=False, env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    one, eight = np.asarray(out["1"]), np.asarray(out["8"])
    np.testing.assert_allclose(eight, one, rtol=1e-5, atol=1e-5)
    assert (eight.argmax(-1) == one.argmax(-1)).all()
    assert out["specs8"][0].count("tp") == 1 and out["specs8"][1].count("tp") == 1
