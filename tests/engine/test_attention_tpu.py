"""`jaxchat.engine.attention_tpu`: the pool layout, `write_kv`, and the Pallas ragged kernel on CPU.

Each step is built from per-row K/V arrays written into shuffled (non-consecutive) pages with `write_kv`; the
expected output is a dense float64 attention computed from those arrays directly (causal over positions, optional
window and soft cap, GQA by head groups), so a wrong interleave, slot, page table or mask shows up as a number
mismatch. The kernel itself runs under TPU interpret mode through `jaxchat.engine.pallas_interpret` (jax 0.10.2's
interpreter cannot run it unpatched; `test_unpatched_interpreter_still_fails` says when that changes).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxchat.engine import attention_tpu as at
from jaxchat.engine.pallas_interpret import interpret_ragged_kernel


@dataclass
class Step:
    q: jax.Array
    kv_pages: jax.Array
    kv_lens: jax.Array
    page_tables: jax.Array
    cu_q_lens: jax.Array
    num_seqs: jax.Array
    rows: list[tuple[int, int]]
    ks: list[np.ndarray]  # per row [kv_len, KV, D], the values as stored (after the cast to the pool dtype)
    vs: list[np.ndarray]

    def args(self):
        return self.q, self.kv_pages, self.kv_lens, self.page_tables, self.cu_q_lens, self.num_seqs


def build_step(seed: int, rows: list[tuple[int, int]], *, num_q_heads: int, num_kv_heads: int, head_dim: int = 128,
               page_size: int = 16, num_pages: int = 16, pages_per_seq: int = 4, max_rows: int = 4,
               num_tokens: int = 16, dtype=jnp.float32) -> Step:
    rng = np.random.default_rng(seed)
    free = list(rng.permutation(np.arange(1, num_pages)))  # shuffled; page 0 only fills unused table entries
    tables = np.zeros((max_rows, pages_per_seq), np.int32)
    ks, vs, slots = [], [], []
    for r, (_, kv_len) in enumerate(rows):
        need = -(-kv_len // page_size)
        tables[r, :need] = [free.pop() for _ in range(need)]
        k = np.asarray(jnp.asarray(rng.standard_normal((kv_len, num_kv_heads, head_dim)), dtype).astype(jnp.float32))
        v = np.asarray(jnp.asarray(rng.standard_normal((kv_len, num_kv_heads, head_dim)), dtype).astype(jnp.float32))
        pos = np.arange(kv_len)
        slots.append(tables[r, pos // page_size] * page_size + pos % page_size)
        ks.append(k)
        vs.append(v)
    # three padding tokens (slot -1) mixed into the write, in a shuffled order
    pad = np.zeros((3, num_kv_heads, head_dim), np.float32) + 7.0
    slots_all = np.concatenate([*slots, [-1, -1, -1]]).astype(np.int32)
    k_cat, v_cat = np.concatenate([*ks, pad]), np.concatenate([*vs, pad])
    order = rng.permutation(len(slots_all))
    pool = at.new_pool(num_pages, page_size, num_kv_heads, head_dim, dtype)
    pool = jax.jit(at.write_kv)(pool, jnp.asarray(k_cat[order], dtype), jnp.asarray(v_cat[order], dtype),
                                jnp.asarray(slots_all[order]))
    cu = np.zeros(max_rows + 1, np.int32)  # entries past num_seqs stay 0, as in JAX's own tests
    cu[1: len(rows) + 1] = np.cumsum([q_len for q_len, _ in rows])
    kv_lens = np.zeros(max_rows, np.int32)
    kv_lens[: len(rows)] = [kv_len for _, kv_len in rows]
    q = jnp.asarray(rng.standard_normal((num_tokens, num_q_heads, head_dim)), dtype)
    return Step(q, pool, jnp.asarray(kv_lens), jnp.asarray(tables), jnp.asarray(cu),
                jnp.asarray([len(rows)], jnp.int32), rows, ks, vs)


def dense_attention(step: Step, *, scale: float, sliding_window: int | None = None,
                    soft_cap: float | None = None) -> np.ndarray:
    """Float64 attention from the rows' own K/V; padding tokens' rows are zero."""
    q = np.asarray(step.q.astype(jnp.float32), np.float64)
    out = np.zeros_like(q)
    group = q.shape[1] // step.ks[0].shape[1]
    start = 0
    for (q_len, kv_len), k, v in zip(step.rows, step.ks, step.vs):
        qr = q[start: start + q_len]
        k, v = np.repeat(k, group, axis=1).astype(np.float64), np.repeat(v, group, axis=1).astype(np.float64)
        s = np.einsum("qhd,khd->hqk", qr, k) * scale
        if soft_cap is not None:
            s = soft_cap * np.tanh(s / soft_cap)
        pos = kv_len - q_len + np.arange(q_len)[:, None]
        kpos = np.arange(kv_len)[None, :]
        seen = kpos <= pos
        if sliding_window is not None:
            seen &= kpos > pos - sliding_window
        s = np.where(seen[None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[start: start + q_len] = np.einsum("hqk,khd->qhd", p, v)
        start += q_len
    return out


def as_np(x: jax.Array) -> np.ndarray:
    return np.asarray(x.astype(jnp.float32), np.float64)


MIXED = [(6, 52), (1, 17), (4, 32)]  # q_len 6 over 4 pages (last partial), a decode row, a prefill on a boundary


def test_write_kv_reads_back():
    step = build_step(0, MIXED, num_q_heads=4, num_kv_heads=2)
    pool = np.asarray(step.kv_pages)
    written = np.zeros(pool.shape[:2], bool)
    for r, (_, kv_len) in enumerate(step.rows):
        table = np.asarray(step.page_tables[r])
        for pos in range(kv_len):
            page, off = table[pos // 16], pos % 16
            np.testing.assert_array_equal(pool[page, off, 0::2], step.ks[r][pos])  # keys at even combined heads
            np.testing.assert_array_equal(pool[page, off, 1::2], step.vs[r][pos])  # values at odd
            written[page, off] = True
    assert not np.any(pool[~written]), "a padding token (slot -1) or a stray write landed in the pool"
    assert any(np.any(np.diff(np.asarray(step.page_tables[r])[: -(-n // 16)]) != 1) for r, (_, n) in enumerate(MIXED))


def test_write_kv_donated_and_padding_never_wraps():
    pool = at.new_pool(2, 4, 1, 128, jnp.float32)
    k = jnp.ones((2, 1, 128)) * jnp.array([1.0, 2.0])[:, None, None]
    write = jax.jit(at.write_kv, donate_argnums=0)
    pool = write(pool, k, -k, jnp.array([-1, 0], jnp.int32))  # -1 must not become the last slot (7)
    got = np.asarray(pool).reshape(8, 2, 128)
    np.testing.assert_array_equal(got[0, 0], 2.0)
    np.testing.assert_array_equal(got[0, 1], -2.0)
    assert not np.any(got[1:]), "slot -1 wrote somewhere"


@pytest.mark.parametrize("heads", [(4, 2), (8, 2)])
def test_reference_matches_dense(heads):
    step = build_step(1, MIXED, num_q_heads=heads[0], num_kv_heads=heads[1])
    got = as_np(at.ragged_attention_reference(*step.args(), scale=0.08))
    np.testing.assert_allclose(got, dense_attention(step, scale=0.08), atol=2e-5, rtol=1e-5)


KERNEL_CASES = {
    # name: (rows, build kwargs, call kwargs, tolerance)
    "gqa4x2-tuned-blocks": (MIXED, dict(num_q_heads=4, num_kv_heads=2), {}, 2e-5),
    "gqa8x2-small-blocks-ragged-tail": ([(6, 21), (1, 9), (5, 5)], dict(num_q_heads=8, num_kv_heads=2, page_size=8,
                                        num_tokens=13), dict(num_kv_pages_per_block=1, num_queries_per_block=4), 2e-5),
    "sliding-window": (MIXED, dict(num_q_heads=4, num_kv_heads=2), dict(sliding_window=5), 2e-5),
    "soft-cap": (MIXED, dict(num_q_heads=4, num_kv_heads=2), dict(soft_cap=0.5), 2e-5),
    "bf16": (MIXED, dict(num_q_heads=8, num_kv_heads=2, dtype=jnp.bfloat16), {}, 3e-2),
}


@pytest.mark.parametrize("name", list(KERNEL_CASES))
def test_kernel_in_interpret_mode_matches_dense_and_reference(name):
    rows, build, call, tol = KERNEL_CASES[name]
    step = build_step(2, rows, **build)
    masks = {k: call[k] for k in ("sliding_window", "soft_cap") if k in call}
    with interpret_ragged_kernel():
        got = as_np(at.ragged_attention(*step.args(), scale=0.3, **call))
    want = dense_attention(step, scale=0.3, **masks)
    if masks:  # the case must exercise its option: the answer differs without it
        assert np.abs(dense_attention(step, scale=0.3) - want).max() > 10 * tol
    np.testing.assert_allclose(got, want, atol=tol, rtol=tol)
    ref = as_np(at.ragged_attention_reference(*step.args(), scale=0.3, **masks))
    np.testing.assert_allclose(got, ref, atol=tol, rtol=tol)
    n = int(step.cu_q_lens[len(rows)])
    assert n < got.shape[0] and not np.any(got[n:]), "padding tokens' rows must be zero"


def test_interpret_flag_raises_with_the_reason():
    step = build_step(3, [(1, 5)], num_q_heads=4, num_kv_heads=2)
    with pytest.raises(NotImplementedError, match="ReshapeTransform"):
        at.ragged_attention(*step.args(), scale=1.0, interpret=True)


def test_head_dim_must_be_a_multiple_of_128():
    step = build_step(3, [(1, 5)], num_q_heads=4, num_kv_heads=2, head_dim=64)
    with pytest.raises(ValueError, match="multiple of 128"):
        at.ragged_attention(*step.args(), scale=1.0)


def test_block_sizes_off_tpu_are_the_kernel_default_clipped():
    assert at.block_sizes(jnp.float32, jnp.float32, 4, 2, 128, 16, 16, 4) == (4, 16)
    assert at.block_sizes(jnp.bfloat16, jnp.bfloat16, 32, 8, 128, 16, 512, 256) == (128, 32)


def test_unpatched_interpreter_still_fails():
    """The finding behind `interpret=True` raising: if this starts passing the kernel, drop the NotImplementedError."""
    from jax.experimental.pallas import tpu as pltpu

    step = build_step(4, [(2, 20)], num_q_heads=4, num_kv_heads=2)
    try:
        with pltpu.force_tpu_interpret_mode(), pytest.raises(Exception, match="'ReshapeTransform' object has no"):
            np.asarray(at.ragged_attention(*step.args(), scale=1.0))
    finally:
        pltpu.reset_tpu_interpret_mode_state()  # required after a failed interpreted kernel


def test_decode_kernel_paged_attention_in_interpret_mode():
    """JAX's decode-only `paged_attention` runs unpatched; it wants K and V apart, heads first (a copy of our pool),
    takes no scale (q is pre-scaled) and computes with K/V cast to bf16 even from an f32 pool."""
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention

    rows = [(1, 52), (1, 1), (1, 33)]
    step = build_step(5, rows, num_q_heads=4, num_kv_heads=2, max_rows=3, num_tokens=3)
    k_pages = jnp.moveaxis(step.kv_pages[:, :, 0::2], 2, 0)  # [KV, num_pages, page_size, D]
    v_pages = jnp.moveaxis(step.kv_pages[:, :, 1::2], 2, 0)
    with pltpu.force_tpu_interpret_mode():
        got = as_np(paged_attention(step.q * 0.3, k_pages, v_pages, step.kv_lens, step.page_tables,
                                    pages_per_compute_block=2))
    np.testing.assert_allclose(got, dense_attention(step, scale=0.3), atol=3e-2, rtol=3e-2)


def test_the_kernel_backend_matches_the_jnp_backend_on_an_engine_step():
    """One ragged step as the engine builds it (a decode row, a chunk, a one-token row, padding), through the
    kernel backend (`PallasAttention`, under the interpret shim) and through the jnp backend (`XlaAttention`, what
    CPU serves with), each writing the same new K/V into its own pool layout over the same page tables."""
    from jaxchat.engine.attention_xla import XlaAttention
    from jaxchat.models.kv import StepInputs

    rng = np.random.default_rng(7)
    page, kvh, heads, dim, width = 16, 2, 4, 128, 4
    runs = [(1, 37), (9, 40), (1, 3)]  # (query count, context length) per row
    tables = rng.permutation(np.arange(1, 13))[:12].reshape(3, width).astype(np.int32)
    pos, rows, cu = [], [], [0]
    for r, (n, length) in enumerate(runs):
        pos += list(range(length - n, length))
        rows += [r] * n
        cu.append(len(pos))
    t = 16
    pos_a = np.array(pos + [-1] * (t - len(pos)), np.int32)
    rows_a = np.array(rows + [0] * (t - len(rows)), np.int32)
    slots = np.where(pos_a >= 0, tables[rows_a, np.maximum(pos_a, 0) // page] * page + np.maximum(pos_a, 0) % page, -1)
    step = StepInputs(jnp.asarray(pos_a), jnp.asarray(rows_a), jnp.asarray(cu, jnp.int32),
                      jnp.asarray([length for _, length in runs], jnp.int32), jnp.asarray(tables),
                      jnp.asarray(slots.astype(np.int32)), jnp.arange(3, dtype=jnp.int32), jnp.asarray([3], jnp.int32))
    # the context before this step, the same values in both pools
    xla, kernel = XlaAttention(page, kv_block=2, query_block=4), at.PallasAttention(page)
    x_pool, k_pool = xla.new_pool(13, page, kvh, dim, jnp.float32), kernel.new_pool(13, page, kvh, dim, jnp.float32)
    before = [(r, p) for r, (n, length) in enumerate(runs) for p in range(length - n)]
    old_k = jnp.asarray(rng.standard_normal((len(before), kvh, dim)), jnp.float32)
    old_v = jnp.asarray(rng.standard_normal((len(before), kvh, dim)), jnp.float32)
    old_slots = jnp.asarray([tables[r, p // page] * page + p % page for r, p in before], jnp.int32)
    from jaxchat.engine.attention_xla import write_kv as xla_write

    x_pool = xla_write(x_pool, None, old_k, old_v, old_slots, page)
    k_pool = at.write_kv(k_pool, old_k, old_v, old_slots)
    q = jnp.asarray(rng.standard_normal((t, heads, dim)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((t, kvh, dim)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((t, kvh, dim)), jnp.float32)
    want = np.asarray(jax.jit(lambda p, q, k, v, s: xla.begin(s).attend(p, None, q, k, v, scale=0.2)[1])(
        x_pool, q, k, v, step))
    with interpret_ragged_kernel():
        got = np.asarray(kernel.begin(step).attend(k_pool, None, q, k, v, scale=0.2)[1])
    n = cu[-1]
    np.testing.assert_allclose(got[:n], want[:n], atol=2e-5, rtol=1e-4)
    assert not np.any(got[n:])
