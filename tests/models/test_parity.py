"""Logit parity with transformers on tiny random checkpoints, full forward and through the cache."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxchat.models import empty_cache, load_model

from .conftest import FAMILIES, build_tiny

TOL = 1e-4
# The programs here are tiny and run a few times each: compiling them at XLA's lowest backend optimisation
# level halves the compile time that dominates this file (the ops, and so the parity checked, are the same).
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def reference_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float().numpy()


@pytest.fixture(scope="module")
def loaded(tiny_dirs):
    return {fam: load_model(d) for fam, (d, _) in tiny_dirs.items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_full_forward_and_incremental_match_transformers(family, tiny_dirs, loaded):
    _, ref_model = tiny_dirs[family]
    lm = loaded[family]
    assert lm.config.family == family
    ids = np.random.default_rng(1).integers(0, 256, (1, 32))
    ref = reference_logits(ref_model, ids)
    fwd = jit(lm.forward)
    toks = jnp.asarray(ids, jnp.int32)
    pos = jnp.arange(32, dtype=jnp.int32)[None]
    ck, cv = empty_cache(lm.config, 1, 40, jnp.float32)
    logits, _, _ = fwd(lm.params, toks, pos, ck, cv)
    assert logits.dtype == jnp.float32 and logits.shape == (1, 32, 256)
    assert np.abs(np.asarray(logits) - ref).max() <= TOL
    # prefill 20 tokens, then decode 12 one at a time through the cache
    out, (ck, cv) = [], empty_cache(lm.config, 1, 40, jnp.float32)  # per-layer tuples for a listed family
    logits, ck, cv = fwd(lm.params, toks[:, :20], pos[:, :20], ck, cv)
    out.append(np.asarray(logits))
    for t in range(20, 32):
        logits, ck, cv = fwd(lm.params, toks[:, t:t + 1], pos[:, t:t + 1], ck, cv)
        out.append(np.asarray(logits))
    assert np.abs(np.concatenate(out, axis=1) - ref).max() <= TOL


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gemma4_text", "lfm2"])
def test_batch_rows_with_padding_are_independent(family, tiny_dirs, loaded):
    """Two rows of different lengths (padding = -1) in one batch equal each row run alone."""
    _, ref_model = tiny_dirs[family]
    lm = loaded[family]
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, 256, 13), rng.integers(0, 256, 9)
    toks = np.zeros((2, 16), np.int32)
    pos = -np.ones((2, 16), np.int32)
    toks[0, :13], pos[0, :13] = a, np.arange(13)
    toks[1, 3:12], pos[1, 3:12] = b, np.arange(9)  # padding on both sides
    ck, cv = empty_cache(lm.config, 2, 24, jnp.float32)
    # stale garbage must never be attended to (nor, for lfm2, be a row's conv state: both rows start at 0)
    ck, cv = jax.tree.map(lambda a: a + 7.0, ck), jax.tree.map(lambda a: a - 3.0, cv)
    logits, ck, cv = jit(lm.forward)(lm.params, jnp.asarray(toks), jnp.asarray(pos), ck, cv)
    logits = np.asarray(logits)
    assert np.abs(logits[0, :13] - reference_logits(ref_model, a[None])[0]).max() <= TOL
    assert np.abs(logits[1, 3:12] - reference_logits(ref_model, b[None])[0]).max() <= TOL
    # one decode step for both rows at different positions
    nxt = np.array([[5], [6]], np.int32)
    step, _, _ = lm.forward(lm.params, jnp.asarray(nxt), jnp.asarray([[13], [9]], jnp.int32), ck, cv)
    ra = reference_logits(ref_model, np.concatenate([a, [5]])[None])[0, -1]
    rb = reference_logits(ref_model, np.concatenate([b, [6]])[None])[0, -1]
    assert np.abs(np.asarray(step)[0, 0] - ra).max() <= TOL
    assert np.abs(np.asarray(step)[1, 0] - rb).max() <= TOL


def test_bf16_sharded_checkpoint_loads(tmp_path):
    """A bf16 checkpoint split into shards (model.safetensors.index.json) loads in bf16 and fp32."""
    ref_model = build_tiny("qwen3", tmp_path, dtype="bfloat16", max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    ids = np.arange(12)[None] * 7 % 256
    ref = reference_logits(ref_model.float(), ids)
    for dtype, tol in (("float32", TOL), ("bfloat16", 0.1)):
        lm = load_model(tmp_path, dtype=dtype)
        assert jax.tree.leaves(lm.params)[0].dtype == jnp.dtype(dtype)
        ck, cv = lm.empty_cache(1, 16)
        assert ck.dtype == jnp.dtype(dtype)
        logits, _, _ = lm.forward(lm.params, jnp.asarray(ids, jnp.int32), jnp.arange(12, dtype=jnp.int32)[None],
                                  ck, cv)
        assert logits.dtype == jnp.float32
        assert np.abs(np.asarray(logits) - ref).max() <= tol


@pytest.mark.parametrize("family", FAMILIES)
def test_vocab_major_head_matches_transformers(family, tiny_dirs, loaded):
    """Logits read from the lm head's vocab-major copy (the CPU runner's batched decode) for several rows
    equal transformers' (tied and untied heads)."""
    _, ref_model = tiny_dirs[family]
    lm = loaded[family]
    c = lm.config
    head = lm.vocab_major_head(lm.params)
    assert head.shape == (c.vocab_size, c.hidden_size)
    ids = np.random.default_rng(3).integers(0, 256, (3, 12))
    ck, cv = empty_cache(c, 3, 16, jnp.float32)
    fwd = jit(lambda p, h, t, pos, k, v: lm.forward(p, t, pos, k, v, head_vd=h))
    pos = jnp.broadcast_to(jnp.arange(12, dtype=jnp.int32), (3, 12))
    logits, _, _ = fwd(lm.params, head, jnp.asarray(ids, jnp.int32), pos, ck, cv)
    assert np.abs(np.asarray(logits) - reference_logits(ref_model, ids)).max() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_layer_cache_with_spans_matches_transformers(family, tiny_dirs, loaded):
    """The CPU step model (`step_model(params, "cpu")`, the "unrolled" layout): per-layer params and a
    per-layer cache cut at the attention spans. Two rows
    prefilled at different lengths, then decoded one token at a time across the cuts, each step attending
    over the smallest span above every position, give transformers' logits (gemma3's sliding window of 8
    falls inside and across the chunks)."""
    _, ref_model = tiny_dirs[family]
    lm = loaded[family]
    step = lm.step_model(lm.params, "cpu")
    assert step.layout == "unrolled" and step.attention_spans and step.vocab_major_head is not None
    spans = (8, 16, 24, 40)
    ck, cv = step.new_cache(2, 40, spans)
    kv = next(i for i, layer in enumerate(cv) if layer)  # the first layer with a KV cache (lfm2: conv first)
    assert [c.shape[2] for c in cv[kv]] == [8, 8, 8, 16]
    assert [c.shape[3] for c in ck[kv]] == [8, 8, 8, 16]
    assert ck[kv][0].dtype == jnp.float32
    params = step.params
    assert isinstance(params["layers"], tuple) and len(params["layers"]) == lm.config.num_layers
    rng = np.random.default_rng(4)
    seqs = [rng.integers(0, 256, 30), rng.integers(0, 256, 26)]
    lens = [6, 11]  # prompt lengths
    toks = np.zeros((2, 16), np.int32)
    pos = -np.ones((2, 16), np.int32)
    for r, n in enumerate(lens):
        toks[r, :n], pos[r, :n] = seqs[r][:n], np.arange(n)
    fwd = jit(step.forward, static_argnames="attend_len")
    logits, ck, cv = fwd(params, jnp.asarray(toks), jnp.asarray(pos), ck, cv)
    got = [[np.asarray(logits)[r, n - 1]] for r, n in enumerate(lens)]
    steps = min(len(s) - n for s, n in zip(seqs, lens, strict=True))
    for i in range(steps):
        p = np.array([[n + i] for n in lens], np.int32)
        t = np.array([[seqs[r][lens[r] + i]] for r in range(2)], np.int32)
        span = next(s for s in spans if s > p.max())
        logits, ck, cv = fwd(params, jnp.asarray(t), jnp.asarray(p), ck, cv, attend_len=span)
        for r in range(2):
            got[r].append(np.asarray(logits)[r, 0])
    for r, n in enumerate(lens):
        ref = reference_logits(ref_model, seqs[r][None, :n + steps])[0, n - 1:]
        assert np.abs(np.stack(got[r]) - ref).max() <= TOL


def test_step_models_of_both_layouts_agree(loaded):
    """What the model tells the step runner, per platform: "unrolled" on CPU (per-layer params and chunked
    cache, a vocab-major head builder), "stacked" elsewhere (the params as given, one cache buffer that
    spans do not cut, no head builder); both forwards give the same logits and attend over spans."""
    lm = loaded["gemma3_text"]
    c = lm.config
    stacked, unrolled = lm.step_model(lm.params, "tpu"), lm.step_model(lm.params, "cpu")
    assert (stacked.layout, unrolled.layout) == ("stacked", "unrolled")
    assert stacked.params is lm.params and stacked.vocab_major_head is None
    assert stacked.attention_spans and unrolled.attention_spans
    ck, cv = stacked.new_cache(2, 24, (8, 16))
    assert ck.shape == cv.shape == (c.num_layers, 2, 24, c.num_kv_heads, c.head_dim)
    ids = jnp.asarray(np.random.default_rng(5).integers(0, 256, (2, 12)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(12, dtype=jnp.int32), (2, 12))
    want, _, _ = stacked.forward(stacked.params, ids, pos, ck, cv, attend_len=16)
    got, _, _ = unrolled.forward(unrolled.params, ids, pos, *unrolled.new_cache(2, 24, (8, 16)), attend_len=16)
    assert np.abs(np.asarray(got) - np.asarray(want)).max() <= TOL


@pytest.mark.parametrize("family", [f for f in ("gpt_oss",) if f in FAMILIES])
def test_routed_experts_grouped_path_matches_transformers(family, tiny_dirs, loaded):
    """Enough tokens that the routed assignments exceed `moe.SCAN_MAX_ROWS`: the experts run as one grouped
    matmul (`jax.lax.ragged_dot`) instead of the per-row scan, with transformers' logits."""
    from jaxchat.models import moe

    _, ref_model = tiny_dirs[family]
    lm = loaded[family]
    ids = np.random.default_rng(6).integers(0, 256, (3, 32))
    assert ids.size * lm.config.num_experts_per_tok > moe.SCAN_MAX_ROWS
    ck, cv = empty_cache(lm.config, 3, 32, jnp.float32)
    pos = jnp.broadcast_to(jnp.arange(32, dtype=jnp.int32), (3, 32))
    logits, _, _ = jit(lm.forward)(lm.params, jnp.asarray(ids, jnp.int32), pos, ck, cv)
    assert np.abs(np.asarray(logits) - reference_logits(ref_model, ids)).max() <= TOL
def test_gemma4_logits_index_keeps_one_position_through_kv_shared_layers(tiny_dirs, loaded):
    """With `logits_index` the KV-shared layers (which write no cache) run on the wanted position only, as
    transformers' `logits_to_keep`: same logits as the full forward at that position, same caches."""
    lm = loaded["gemma4_text"]
    rng = np.random.default_rng(6)
    toks = jnp.asarray(rng.integers(0, 256, (2, 16)), jnp.int32)
    pos = jnp.asarray(np.stack([np.arange(16), np.r_[np.arange(11), -np.ones(5)]]).astype(np.int32))
    fwd = jit(lm.forward)
    full, *cache = fwd(lm.params, toks, pos, *empty_cache(lm.config, 2, 24, jnp.float32))
    kept, *kept_cache = fwd(lm.params, toks, pos, *empty_cache(lm.config, 2, 24, jnp.float32),
                            logits_index=jnp.asarray([15, 10], jnp.int32))
    assert kept.shape == (2, 1, 256)
    assert np.abs(np.asarray(kept)[:, 0] - np.asarray(full)[[0, 1], [15, 10]]).max() <= TOL
    for a, b in zip(jax.tree.leaves(cache), jax.tree.leaves(kept_cache), strict=True):
        assert np.abs(np.asarray(a) - np.asarray(b)).max() <= TOL
