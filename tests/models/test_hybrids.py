"""The Gated DeltaNet hybrids (qwen3_next, qwen3_5_text, qwen3_5_moe): the chunked delta rule against the
per-token recurrence, prompts longer than one scan chunk, padding and state resets (through the paged step:
state slots beside the KV pages), configs, orbax, and the engine (batch isolation with per-row recurrent state,
transformers' greedy tokens, no recompiles)."""

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
import torch

from jaxchat.models import from_hf_config, load_model, save_orbax, to_hf_config
from jaxchat.models.base import RecurrentState
from jaxchat.models.deltanet import chunk_delta_rule as chunked
from jaxchat.models.deltanet import recurrent_step

from .conftest import HYBRIDS
from .paged import PagedRows

TOL = 1e-4
ROOT = Path(__file__).resolve().parents[2]


def reference_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float().numpy()


def test_chunked_delta_rule_equals_the_recurrence_and_padding_passes_the_state_through():
    rng = np.random.default_rng(0)
    b, t, h, dk, dv = 2, 21, 3, 8, 4
    q, k = (jnp.asarray(rng.normal(size=(b, t, h, dk)), jnp.float32) for _ in range(2))
    k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    v = jnp.asarray(rng.normal(size=(b, t, h, dv)), jnp.float32)
    g = -jnp.asarray(rng.uniform(0.01, 2.0, size=(b, t, h)), jnp.float32)
    beta = jnp.asarray(rng.uniform(size=(b, t, h)), jnp.float32)
    s0 = jnp.asarray(rng.normal(size=(b, h, dk, dv)), jnp.float32)
    def recurrence(s, xs):
        o, s = recurrent_step(*xs, s)
        return s, o

    s, want = jax.lax.scan(recurrence, s0, tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, g, beta)))
    want = jnp.moveaxis(want, 0, 1)
    chunk_delta_rule = jax.jit(chunked, static_argnums=6)
    for chunk in (4, 8, 64):  # 21 tokens: a partial last chunk, several chunks, one padded chunk
        got, state = chunk_delta_rule(q, k, v, g, beta, s0, chunk)
        assert np.abs(np.asarray(got - want)).max() <= 1e-4
        assert np.abs(np.asarray(state - s)).max() <= 1e-4
    pad = np.arange(t) >= 15  # padding tokens: beta = g = 0 leave the state as after token 14
    _, state = chunk_delta_rule(q, k, v, jnp.where(pad[None, :, None], 0.0, g), jnp.where(pad[None, :, None], 0.0, beta),
                                s0, 8)
    _, want15 = chunk_delta_rule(q[:, :15], k[:, :15], v[:, :15], g[:, :15], beta[:, :15], s0, 8)
    assert np.abs(np.asarray(state - want15)).max() <= 1e-4


@pytest.fixture(scope="module")
def hybrids(tiny_dirs):
    return {fam: (load_model(tiny_dirs[fam][0]), tiny_dirs[fam][1]) for fam in HYBRIDS}


@pytest.mark.parametrize("family", HYBRIDS)
def test_prompt_longer_than_one_scan_chunk(family, hybrids):
    """80 tokens (chunks of 64): prefill of 70 (a whole chunk and part of the next: the state crosses a chunk
    boundary inside the scan) then 10 decode steps equal transformers' full forward."""
    lm, ref_model = hybrids[family]
    ids = np.random.default_rng(7).integers(0, 256, (1, 80))
    ref = reference_logits(ref_model, ids)
    pos = np.arange(80)[None]
    rows = PagedRows(lm, 1, 96)
    out = [rows(ids[:, :70], pos[:, :70])]
    out += [rows(ids[:, t:t + 1], pos[:, t:t + 1]) for t in range(70, 80)]
    assert np.abs(np.concatenate(out, axis=1) - ref).max() <= TOL


def row_parts(lm, rows: PagedRows, pools, row: int):
    """Everything of `pools` that belongs to `row`: its recurrent states' slot and its KV pages, per layer."""
    from jaxchat.models.families import family_module

    dims = family_module(lm.config.family).Model.cache_dims(lm.config)
    parts = []
    for dim, entry in zip(dims, pools, strict=True):
        if isinstance(dim, RecurrentState):
            parts += [np.asarray(x)[row] for x in entry]
        elif dim is not None:
            parts += [np.asarray(x)[rows.tables[row]] for x in entry]
    return parts


def test_padding_and_stale_state_rows_are_independent(hybrids):
    """Rows padded on both sides in one step, over pools full of stale state (a position-0 token resets the
    row's state slot), equal each row alone; an idle row (position -1) in decode keeps its state and pages."""
    lm, ref_model = hybrids["qwen3_5_moe"]
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, 256, 13), rng.integers(0, 256, 9)
    toks = np.zeros((2, 16), np.int32)
    pos = -np.ones((2, 16), np.int32)
    toks[0, :13], pos[0, :13] = a, np.arange(13)
    toks[1, 3:12], pos[1, 3:12] = b, np.arange(9)
    rows = PagedRows(lm, 2, 24)
    leaves, tree = jax.tree.flatten(rows.pools)
    rows.pools = jax.tree.unflatten(tree, [x + (7.0 if i % 2 else -3.0) for i, x in enumerate(leaves)])
    logits = rows(toks, pos)
    assert np.abs(logits[0, :13] - reference_logits(ref_model, a[None])[0]).max() <= TOL
    assert np.abs(logits[1, 3:12] - reference_logits(ref_model, b[None])[0]).max() <= TOL
    before = rows.pools
    idle = rows(np.array([[5], [0]]), np.array([[13], [-1]]))
    ra = reference_logits(ref_model, np.concatenate([a, [5]])[None])[0, -1]
    assert np.abs(idle[0, 0] - ra).max() <= TOL
    kept, now = row_parts(lm, rows, before, 1), row_parts(lm, rows, rows.pools, 1)
    assert len(kept) == 8  # 2 DeltaNet layers' conv window and matrix, 2 attention layers' keys and values
    for x, y in zip(kept, now, strict=True):
        np.testing.assert_array_equal(x, y)  # the idle row is untouched
    assert any(np.abs(x - y).max() > 0 for x, y in zip(row_parts(lm, rows, before, 0),
                                                         row_parts(lm, rows, rows.pools, 0), strict=True))
    rows.pools = before
    step = rows(np.array([[5], [6]]), np.array([[13], [9]]))
    rb = reference_logits(ref_model, np.concatenate([b, [6]])[None])[0, -1]
    assert np.abs(step[0, 0] - ra).max() <= TOL
    assert np.abs(step[1, 0] - rb).max() <= TOL


@pytest.mark.parametrize("family", HYBRIDS)
def test_config_round_trip_and_wrappers(family, tiny_dirs):
    raw = json.loads((tiny_dirs[family][0] / "config.json").read_text())
    cfg = from_hf_config(raw)
    assert cfg.family == family and cfg.layer_types[0] == "linear_attention" and cfg.partial_rotary_factor == 0.5
    back = from_hf_config(to_hf_config(cfg))
    assert back == cfg and hash(back) == hash(cfg)
    wrapper = {"qwen3_5_text": "qwen3_5", "qwen3_5_moe": "qwen3_5_moe"}.get(family)
    if wrapper:  # the multimodal checkpoints' config: the text decoder's fields under text_config
        assert from_hf_config({"model_type": wrapper, "text_config": raw}) == cfg


def test_orbax_round_trip(hybrids, tmp_path):
    src, _ = hybrids["qwen3_5_moe"]
    back = load_model(save_orbax(src, tmp_path / "ckpt"))
    assert back.config == src.config and isinstance(back.params["layers"], tuple)
    for x, y in zip(jax.tree.leaves(src.params), jax.tree.leaves(back.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("family", HYBRIDS)
def test_engine_isolation_generate_parity_and_no_recompiles(family, hybrids):
    from jaxchat.engine.engine import Engine
    from tests.engine.test_real_model import greedy, isolation_plan, run_plan

    lm, ref_model = hybrids[family]
    prompt = [11, 12, 13, 14, 15, 16, 17]
    engine = Engine(lm, max_batch=4, max_context=48, start=False, decode_rows=(2, 4),
                    max_step_tokens=32)  # few programs, few compiles; 2-row decodes read 2 of the 4 state slots
    alone = run_plan(engine, {0: [("submit", greedy("p", prompt, 16))]})["p"]
    mixed = run_plan(engine, isolation_plan(prompt, 16))
    assert mixed["p"] == alone
    with torch.no_grad():
        want = ref_model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0, len(prompt):].tolist()
    assert alone == want
    assert engine.stats().compiles_on_request_path == 0


def test_multimodal_checkpoint_loads_its_text_decoder(tiny_dirs, hybrids, tmp_path):
    """A Qwen3.5-MoE checkpoint as the multimodal models ship it ("qwen3_5_moe" config with a text_config, the
    decoder under model.language_model., experts stacked per layer, a vision tower and mtp heads beside it)
    loads the same params as transformers' per-expert save."""
    from safetensors.numpy import load_file, save_file

    src = tiny_dirs["qwen3_5_moe"][0]
    raw = json.loads((src / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": raw}))
    flat = load_file(str(src / "model.safetensors"))
    tensors = {}
    for k, v in flat.items():
        if ".mlp.experts." in k:
            continue
        tensors[k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k] = v
    for i in range(raw["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp.experts."
        experts = range(raw["num_experts"])
        tensors[f"model.language_model.layers.{i}.mlp.experts.gate_up_proj"] = np.stack(
            [np.concatenate([flat[f"{p}{j}.gate_proj.weight"], flat[f"{p}{j}.up_proj.weight"]]) for j in experts])
        tensors[f"model.language_model.layers.{i}.mlp.experts.down_proj"] = np.stack(
            [flat[f"{p}{j}.down_proj.weight"] for j in experts])
    tensors["model.visual.blocks.0.attn.qkv.weight"] = np.zeros((3, 2), np.float32)
    tensors["mtp.fc.weight"] = np.zeros((2, 2), np.float32)
    save_file(tensors, str(tmp_path / "model.safetensors"))
    lm, want = load_model(tmp_path), hybrids["qwen3_5_moe"][0]
    assert lm.config == want.config
    for x, y in zip(jax.tree.leaves(lm.params), jax.tree.leaves(want.params), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


SHARDED = textwrap.dedent("""
    import json, sys
    import jax
    from jaxchat.engine.engine import Engine
    from jaxchat.engine.step import make_mesh
    from jaxchat.models import load_model
    from tests.engine.test_real_model import isolation_plan, run_plan
    out = {}
    for path, counts in zip(sys.argv[1::2], sys.argv[2::2]):
        for n in map(int, counts.split(",")):
            e = Engine(load_model(path, "float32", None), max_batch=4, max_context=48, mesh=make_mesh(jax.devices()[:n]),
                       start=False, decode_rows=(4,), max_step_tokens=16)  # 25-token prompts: 2 chunks
            out[f"{path}:{n}"] = run_plan(e, isolation_plan([11, 12, 13, 14, 15], 12))
            out[f"{path}:specs{n}"] = [str(x.sharding.spec) for x in e.runner.state.pools[0]]  # layer 0's state
    print(json.dumps(out))
""")


def test_sharded_over_fake_devices_equals_unsharded(tiny_dirs):
    """Greedy output on 4 and 8 fake CPU devices equals one device, for a DeltaNet hybrid and for LFM2 (one
    subprocess for both). The engine's state slots shard their second axis over 'tp' where it divides: qwen3_next
    on 4: the matrix state [slots, 4 heads, dk, dv] splits its heads (its conv window [slots, L-1, channels], and
    the heads on 8 devices, stay replicated: nothing divides). lfm2 on 8: the conv window [slots, 64 channels,
    L-1] splits its channels."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT)}
    nxt, lfm = str(tiny_dirs["qwen3_next"][0]), str(tiny_dirs["lfm2"][0])
    proc = subprocess.run([sys.executable, "-c", SHARDED, nxt, "1,4,8", lfm, "1,8"], check=False, env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out[f"{nxt}:1"] == out[f"{nxt}:4"] == out[f"{nxt}:8"]
    assert out[f"{lfm}:1"] == out[f"{lfm}:8"]
    specs4 = out[f"{nxt}:specs4"]
    assert "tp" not in specs4[0] and specs4[1].count("tp") == 1  # window replicated, heads split
    assert all(s.count("tp") == 1 for s in out[f"{lfm}:specs8"]), out[f"{lfm}:specs8"]
