"""Logit parity with transformers on tiny random checkpoints, through the paged step: a whole prompt, a
prefill then one-token steps, rows with padding, ragged steps of rows of different lengths, both layouts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxchat.models import load_model

from .conftest import FAMILIES, build_tiny
from .paged import PagedRows, run_ragged

TOL = 1e-4


def reference_logits(model, ids: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float().numpy()


@pytest.fixture(scope="module")
def loaded(tiny_dirs):
    return {fam: load_model(d) for fam, (d, _) in tiny_dirs.items()}


def positional(lm) -> bool:
    return lm.positional_cache


@pytest.mark.parametrize("family", FAMILIES)
def test_full_forward_and_incremental_match_transformers(family, tiny_dirs, loaded):
    """The whole 32-token prompt in one step, then 20 tokens and 12 one-token steps through the pages (both
    layouts: the scanned stack on accelerators, per-layer params and pools on CPU)."""
    _, ref_model = tiny_dirs[family]
    lm = loaded[family]
    assert lm.config.family == family
    ids = np.random.default_rng(1).integers(0, 256, (1, 32))
    ref = reference_logits(ref_model, ids)
    pos = np.arange(32)[None]
    logits = PagedRows(lm, 1, 40)(ids, pos)
    assert logits.shape == (1, 32, 256)
    assert np.abs(logits - ref).max() <= TOL
    for layout in ("stacked", "unrolled") if lm.stacked else ("unrolled",):
        step = lm.step_model(lm.params, "cpu" if layout == "unrolled" else "tpu")
        rows = PagedRows(lm, 1, 40, layout=layout, params=step.params)
        out = [rows(ids[:, :20], pos[:, :20])]
        out += [rows(ids[:, t:t + 1], pos[:, t:t + 1]) for t in range(20, 32)]
        assert np.abs(np.concatenate(out, axis=1) - ref).max() <= TOL, layout


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "gemma4_text", "lfm2"])
def test_batch_rows_with_padding_are_independent(family, tiny_dirs, loaded):
    """Two rows of different lengths (padding = -1 on both sides) in one step equal each row run alone."""
    _, ref_model = tiny_dirs[family]
    lm = loaded[family]
    rng = np.random.default_rng(2)
    a, b = rng.integers(0, 256, 13), rng.integers(0, 256, 9)
    toks = np.zeros((2, 16), np.int32)
    pos = -np.ones((2, 16), np.int32)
    toks[0, :13], pos[0, :13] = a, np.arange(13)
    toks[1, 3:12], pos[1, 3:12] = b, np.arange(9)  # padding on both sides
    rows = PagedRows(lm, 2, 24)
    # stale garbage must never be attended to (nor, for lfm2, be a row's conv state: both rows start at 0)
    rows.pools = jax.tree.map(lambda x: x + 7.0, rows.pools)
    logits = rows(toks, pos)
    assert np.abs(logits[0, :13] - reference_logits(ref_model, a[None])[0]).max() <= TOL
    assert np.abs(logits[1, 3:12] - reference_logits(ref_model, b[None])[0]).max() <= TOL
    # one step for both rows at different positions
    step = rows(np.array([[5], [6]]), np.array([[13], [9]]))
    ra = reference_logits(ref_model, np.concatenate([a, [5]])[None])[0, -1]
    rb = reference_logits(ref_model, np.concatenate([b, [6]])[None])[0, -1]
    assert np.abs(step[0, 0] - ra).max() <= TOL
    assert np.abs(step[1, 0] - rb).max() <= TOL


@pytest.mark.parametrize("family", FAMILIES)
def test_ragged_steps_match_transformers(family, tiny_dirs, loaded):
    """What the engine runs: three rows packed back to back in one step with different token counts (a
    prompt, a prompt's second chunk, one token), then steps where each row runs 1, 3 or 1 tokens, across
    page boundaries (pages of 4, windows of 8); each row's last logits are transformers'. On the CPU step
    model (per-layer pools, the vocab-major head for the rows' logits)."""
    _, ref_model = tiny_dirs[family]
    lm = loaded[family]
    if not positional(lm):
        pytest.skip("recurrent layers run uniform steps only")
    step_model = lm.step_model(lm.params, "cpu")
    head = step_model.vocab_major_head(step_model.params, None)
    rng = np.random.default_rng(4)
    seqs = [list(rng.integers(0, 256, 30)) for _ in range(3)]
    rows = PagedRows(lm, 3, 40, layout="unrolled", params=step_model.params)
    run_ragged(rows, [(1, seqs[1][:5], 0)])  # row 1's first chunk alone (rows 0 and 2: nothing yet)
    lens = [7, 13, 1]
    got = run_ragged(rows, [(0, seqs[0][:7], 0), (1, seqs[1][5:13], 5), (2, seqs[2][:1], 0)], head_vd=head)
    checks = [(r, lens[r], got[r]) for r in range(3)]
    for takes in ([1, 3, 1], [2, 1, 4], [1, 1, 1]):
        runs = [(r, seqs[r][lens[r]:lens[r] + n], lens[r]) for r, n in enumerate(takes)]
        got = run_ragged(rows, runs, head_vd=head)
        lens = [n + t for n, t in zip(lens, takes, strict=True)]
        checks += [(r, lens[r], got[r]) for r in range(3)]
    for r, n, logits in checks:
        ref = reference_logits(ref_model, np.asarray(seqs[r][:n])[None])[0, -1]
        assert np.abs(logits - ref).max() <= TOL, (r, n)


def test_bf16_sharded_checkpoint_loads(tmp_path):
    """A bf16 checkpoint split into shards (model.safetensors.index.json) loads in bf16 and fp32."""
    ref_model = build_tiny("qwen3", tmp_path, dtype="bfloat16", max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    ids = np.arange(12)[None] * 7 % 256
    ref = reference_logits(ref_model.float(), ids)
    for dtype, tol in (("float32", TOL), ("bfloat16", 0.1)):
        lm = load_model(tmp_path, dtype=dtype)
        assert jax.tree.leaves(lm.params)[0].dtype == jnp.dtype(dtype)
        rows = PagedRows(lm, 1, 16)
        assert all(x.dtype == jnp.dtype(dtype) for x in jax.tree.leaves(rows.pools))
        logits = rows(ids, np.arange(12)[None])
        assert logits.dtype == np.float32
        assert np.abs(logits - ref).max() <= tol


@pytest.mark.parametrize("family", FAMILIES)
def test_vocab_major_head_matches_transformers(family, tiny_dirs, loaded):
    """Logits read from the lm head's vocab-major copy (the CPU runner's batched rows) for several rows
    equal transformers' (tied and untied heads)."""
    _, ref_model = tiny_dirs[family]
    lm = loaded[family]
    c = lm.config
    head = lm.vocab_major_head(lm.params)
    assert head.shape == (c.vocab_size, c.hidden_size)
    ids = np.random.default_rng(3).integers(0, 256, (3, 12))
    pos = np.broadcast_to(np.arange(12), (3, 12))
    logits = PagedRows(lm, 3, 16)(ids, pos, head_vd=head)
    assert np.abs(logits - reference_logits(ref_model, ids)).max() <= TOL


def test_step_models_of_both_layouts_agree(loaded):
    """What the model tells the step runner, per platform: "unrolled" on CPU (per-layer params and pools, a
    vocab-major head builder), "stacked" elsewhere (the params as given, one stacked pool, no head builder);
    both forwards give the same logits."""
    lm = loaded["gemma3_text"]
    c = lm.config
    stacked, unrolled = lm.step_model(lm.params, "tpu"), lm.step_model(lm.params, "cpu")
    assert (stacked.layout, unrolled.layout) == ("stacked", "unrolled")
    assert stacked.params is lm.params and stacked.vocab_major_head is None
    assert unrolled.vocab_major_head is not None and isinstance(unrolled.params["layers"], tuple)
    rows_s = PagedRows(lm, 2, 24, layout="stacked")
    keys = rows_s.pools[0]
    assert keys.shape[:2] == (c.num_layers, rows_s.tables.size + 1)
    rows_u = PagedRows(lm, 2, 24, layout="unrolled", params=unrolled.params)
    assert len(rows_u.pools) == c.num_layers
    ids = np.random.default_rng(5).integers(0, 256, (2, 12))
    pos = np.broadcast_to(np.arange(12), (2, 12))
    assert np.abs(rows_u(ids, pos) - rows_s(ids, pos)).max() <= TOL


@pytest.mark.parametrize("family", [f for f in ("gpt_oss",) if f in FAMILIES])
def test_routed_experts_grouped_path_matches_transformers(family, tiny_dirs, loaded):
    """Enough tokens that the routed assignments exceed `moe.SCAN_MAX_ROWS`: the experts run as one grouped
    matmul (`jax.lax.ragged_dot`) instead of the per-row scan, with transformers' logits."""
    from jaxchat.models import moe

    _, ref_model = tiny_dirs[family]
    lm = loaded[family]
    ids = np.random.default_rng(6).integers(0, 256, (3, 32))
    assert ids.size * lm.config.num_experts_per_tok > moe.SCAN_MAX_ROWS
    logits = PagedRows(lm, 3, 32)(ids, np.broadcast_to(np.arange(32), (3, 32)))
    assert np.abs(logits - reference_logits(ref_model, ids)).max() <= TOL


def test_gemma4_logits_index_keeps_one_position_through_kv_shared_layers(tiny_dirs, loaded):
    """With `logits_index` the KV-shared layers (which write no pages) run on the wanted position only, as
    transformers' `logits_to_keep`: same logits as the full forward at that position, same pools."""
    lm = loaded["gemma4_text"]
    rng = np.random.default_rng(6)
    toks = rng.integers(0, 256, (2, 16))
    pos = np.stack([np.arange(16), np.r_[np.arange(11), -np.ones(5)]]).astype(np.int32)
    full_rows, kept_rows = PagedRows(lm, 2, 24), PagedRows(lm, 2, 24)
    full = full_rows(toks, pos)
    kept = kept_rows(toks, pos, logits_index=jnp.asarray([15, 16 + 10], jnp.int32))
    assert kept.shape == (2, 256)
    assert np.abs(kept - full[[0, 1], [15, 10]]).max() <= TOL
    for a, b in zip(jax.tree.leaves(full_rows.pools), jax.tree.leaves(kept_rows.pools), strict=True):
        assert np.abs(np.asarray(a) - np.asarray(b)).max() <= TOL
