"""Routed experts (`models/moe.py`) and the qwen3_moe family beyond the parametrized parity tests: both
expert paths against a dense reference, the fused HF naming, norm_topk_prob off, mixed dense/sparse layers,
and expert parallelism over 8 fake CPU devices (a subprocess: XLA_FLAGS must be set before jax loads)."""

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
from safetensors.numpy import load_file, save_file

from jaxchat.models import ModelLoadError, load_model, moe

from .conftest import build_tiny
from .paged import PagedRows
from .test_parity import TOL, reference_logits

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("scan", [True, False])
def test_expert_paths_match_a_dense_reference(scan, monkeypatch):
    """Per-row scan (decode on CPU) and grouped ragged_dot both equal every token times its own experts."""
    monkeypatch.setattr(moe, "SCAN_MAX_ROWS", 1 << 20 if scan else 0)
    rng = np.random.default_rng(0)
    n, e, k, d, f = 7, 8, 3, 16, 12
    x = rng.normal(size=(n, d)).astype(np.float32)
    w = rng.normal(size=(e, d, f)).astype(np.float32)
    b = rng.normal(size=(e, f)).astype(np.float32)
    logits = rng.normal(size=(n, e)).astype(np.float32)
    for normalize in (False, True):
        weights, experts = moe.softmax_topk(jnp.asarray(logits), k, normalize)
        d_ = moe.dispatch(experts, weights, e)
        assert np.all(np.diff(np.asarray(d_.expert)) >= 0) and int(d_.group_sizes.sum()) == n * k
        y = moe.expert_matmul(moe.gather_rows(jnp.asarray(x), d_), jnp.asarray(w), d_) + moe.expert_bias(b, d_)
        got = np.asarray(moe.combine(y, d_, n))
        probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
        want = np.zeros((n, f), np.float32)
        for t in range(n):
            top = np.argsort(-probs[t])[:k]
            p = probs[t, top] / (probs[t, top].sum() if normalize else 1.0)
            want[t] = sum(pi * (x[t] @ w[j] + b[j]) for pi, j in zip(p, top, strict=True))
        assert np.abs(got - want).max() <= 1e-4
    top_w, top_e = moe.topk_softmax(jnp.asarray(logits), k)
    np.testing.assert_allclose(np.asarray(top_w).sum(-1), 1.0, rtol=1e-6)
    assert (np.asarray(top_e) == np.argsort(-logits, axis=-1)[:, :k]).all()


def _logits(lm, ids):
    return PagedRows(lm, ids.shape[0], ids.shape[1])(ids, np.broadcast_to(np.arange(ids.shape[1]), ids.shape))


def test_fused_expert_naming_loads_the_same_model(tiny_dirs, tmp_path):
    """transformers' in-memory naming (mlp.experts.gate_up_proj [E, 2f, d], down_proj [E, d, f]) in some
    layers and the per-expert naming of released checkpoints in others give the same params."""
    src, ref_model = tiny_dirs["qwen3_moe"]
    tensors = load_file(str(src / "model.safetensors"))
    for i in (0, 2):
        p = f"model.layers.{i}.mlp.experts."
        gate = [tensors.pop(f"{p}{j}.gate_proj.weight") for j in range(8)]
        up = [tensors.pop(f"{p}{j}.up_proj.weight") for j in range(8)]
        tensors[p + "gate_up_proj"] = np.stack([np.concatenate([g, u]) for g, u in zip(gate, up, strict=True)])
        tensors[p + "down_proj"] = np.stack([tensors.pop(f"{p}{j}.down_proj.weight") for j in range(8)])
    dst = tmp_path / "fused"
    dst.mkdir()
    save_file(tensors, str(dst / "model.safetensors"))
    (dst / "config.json").write_text((src / "config.json").read_text())
    a, b = load_model(src), load_model(dst)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    tensors.pop("model.layers.2.mlp.experts.down_proj")
    save_file(tensors, str(dst / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"missing tensor 'model\.layers\.2\.mlp\.experts\.down_proj'"):
        load_model(dst)


def test_unnormalised_topk_matches_transformers(tmp_path):
    ref_model = build_tiny("qwen3_moe", tmp_path, norm_topk_prob=False, num_hidden_layers=2, seed=1)
    lm = load_model(tmp_path)
    assert not lm.config.norm_topk_prob
    ids = np.random.default_rng(6).integers(0, 256, (2, 12))
    assert np.abs(_logits(lm, ids) - reference_logits(ref_model, ids)).max() <= TOL


def test_mixed_dense_and_sparse_layers_match_transformers(tmp_path):
    """mlp_only_layers and decoder_sparse_step > 1 (dense layers between sparse ones): listed layers, full
    forward and prefill-then-decode through the per-layer pools equal transformers."""
    ref_model = build_tiny("qwen3_moe", tmp_path, num_hidden_layers=4, mlp_only_layers=[1], decoder_sparse_step=2,
                           intermediate_size=48)
    lm = load_model(tmp_path)
    assert lm.config.is_sparse == (False, False, False, True) and not lm.stacked
    assert lm.params["layers"][0]["mlp"]["gate_up"].shape == (2, 48, 64)
    assert lm.params["layers"][3]["mlp"]["gate_up"].shape == (8, 64, 2, 32)
    ids = np.random.default_rng(7).integers(0, 256, (1, 16))
    ref = reference_logits(ref_model, ids)
    assert np.abs(_logits(lm, ids) - ref).max() <= TOL
    rows, pos = PagedRows(lm, 1, 24), np.arange(16)[None]
    got = [rows(ids[:, :10], pos[:, :10])]
    got += [rows(ids[:, t:t + 1], pos[:, t:t + 1]) for t in range(10, 16)]
    assert np.abs(np.concatenate(got, axis=1) - ref).max() <= TOL


EP_SCRIPT = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    from jaxchat.engine.engine import Engine
    from jaxchat.engine.step import make_mesh
    from jaxchat.models import load_model
    from tests.engine.test_real_model import greedy as request, run_plan
    from tests.models.paged import PagedRows
    devs = jax.devices()
    assert len(devs) == 8, devs
    src = sys.argv[1]

    def greedy(model, prompts, n):
        b, t = prompts.shape
        rows = PagedRows(model, b, t + n)
        logits = rows(prompts, np.tile(np.arange(t), (b, 1)))
        first, out = logits, [logits[:, -1].argmax(-1)]
        for i in range(t, t + n - 1):
            out.append(rows(out[-1][:, None], np.full((b, 1), i))[:, -1].argmax(-1))
        return first, np.stack(out, 1)

    one = load_model(src)
    prompts = np.arange(20).reshape(2, 10) * 13 % 256
    ref_logits, ref_tokens = greedy(one, prompts, 8)
    # expert parallelism on the engine's 1-D 'tp' mesh, and over 'ep' beside 'tp' on a 2-D mesh
    for shape, names, want_gu, want_down in (((8,), ("tp",), P(None, "tp", None, None, None), P(None, "tp", None, None)),
                                             ((4, 2), ("ep", "tp"), P(None, "ep", None, None, "tp"),
                                              P(None, "ep", "tp", None))):
        mesh = Mesh(np.array(devs).reshape(shape), names)
        m = load_model(src, mesh=mesh)
        mlp = m.params["layers"]["mlp"]
        assert mlp["gate_up"].sharding.spec == want_gu, mlp["gate_up"].sharding.spec
        assert mlp["down"].sharding.spec == want_down, mlp["down"].sharding.spec
        assert mlp["router"].sharding.spec == P(None, None, None)
        per_device = 8 // shape[0]  # experts per device
        assert {s.data.shape[1] for s in mlp["gate_up"].addressable_shards} == {per_device}
        assert len({s.device for s in mlp["gate_up"].addressable_shards}) == 8
        if len(shape) == 1:
            continue  # the engine below runs this mesh
        logits, tokens = greedy(m, prompts, 8)  # the params on the 2-D mesh; no engine pools live there
        assert np.abs(logits - ref_logits).max() <= 1e-4, np.abs(logits - ref_logits).max()
        np.testing.assert_array_equal(tokens, ref_tokens)
    # the engine (continuous batching, the CPU layout) on the 8-device 'tp' mesh: experts sharded, greedy
    # tokens of a prompt joined by another equal one device's
    e = Engine(load_model(src, "float32", None), max_batch=2, max_context=32, mesh=make_mesh(devs), start=False,
               warmup=False)
    layer0 = e.runner.params["layers"][0]["mlp"]["gate_up"]
    assert layer0.sharding.spec[0] == "tp" and len(layer0.addressable_shards) == 8, layer0.sharding
    prompt = [11, 12, 13, 14, 15]
    got = run_plan(e, {0: [("submit", request("p", prompt, 12))], 3: [("submit", request("c", [9] * 11, 6))]})
    assert got["p"] == greedy(one, np.asarray([prompt]), 12)[1][0].tolist(), got
    assert got["c"] == greedy(one, np.asarray([[9] * 11]), 6)[1][0].tolist(), got
    print("EP-OK", json.dumps(got["p"]))
""")



def test_expert_parallel_over_8_cpu_devices_matches_one(tmp_path):
    ckpt = tmp_path / "tiny"
    build_tiny("qwen3_moe", ckpt, vocab_size=264, num_hidden_layers=2)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", EP_SCRIPT, str(ckpt)], env=env, check=False, capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0 and "EP-OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert len(json.loads(proc.stdout.strip().splitlines()[-1].split(" ", 1)[1])) == 12
