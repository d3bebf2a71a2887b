"""The jnp ragged paged attention (`engine.attention_xla`) against a dense float64 attention computed from the
same keys and values: rows of different query counts and context lengths across page and item boundaries,
pages scattered over the pool, GQA, sliding windows, soft-capping, sinks, padding rows and tokens, a stacked
pool, and the unrolled analysis loop (`trip_counts`)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxchat.engine.attention_xla import XlaAttention
from jaxchat.engine.compile_level import FAST_COMPILE_OPTIONS
from jaxchat.models.kv import StepInputs

PAGE, KVH, HEADS, D, PAGES_PER_ROW = 4, 2, 4, 8, 8


def dense_reference(q, keys, values, rows, qpos, scale, window=None, softcap=None, sinks=None):
    """float64 attention of each query over its row's positions <= its own (and > position - window)."""
    out = np.zeros(q.shape, np.float64)
    g = HEADS // KVH
    for t in range(q.shape[0]):
        p = qpos[t]
        if p < 0:
            continue
        k, v = keys[rows[t], :p + 1].astype(np.float64), values[rows[t], :p + 1].astype(np.float64)
        for h in range(HEADS):
            s = k[:, h // g] @ q[t, h].astype(np.float64) * scale
            if softcap is not None:
                s = np.tanh(s / softcap) * softcap
            if window is not None:
                s = np.where(np.arange(p + 1) > p - window, s, -np.inf)
            top = s.max() if sinks is None else max(s.max(), sinks[h])
            e = np.exp(s - top)
            den = e.sum() + (0.0 if sinks is None else np.exp(sinks[h] - top))
            out[t, h] = (e[:, None] * v[:, h // g]).sum(0) / den
    return out


def build_step(runs, seed, pad=3):
    """runs[i] = (query count, context length) of row i -> (pool contents, the step, the new k/v, the layout)."""
    rng = np.random.default_rng(seed)
    r = len(runs)
    num_pages = 1 + r * PAGES_PER_ROW + 2
    tables = rng.permutation(np.arange(1, num_pages))[: r * PAGES_PER_ROW].reshape(r, PAGES_PER_ROW).astype(np.int32)
    keys = rng.standard_normal((r, PAGES_PER_ROW * PAGE, KVH, D)).astype(np.float32)
    values = rng.standard_normal((r, PAGES_PER_ROW * PAGE, KVH, D)).astype(np.float32)
    k_pool = np.zeros((num_pages, KVH, D, PAGE), np.float32)
    v_pool = np.zeros((num_pages, KVH, PAGE, D), np.float32)
    pos, rows, slots, cu = [], [], [], [0]
    for i, (n, length) in enumerate(runs):
        for p in range(length - n):  # the context before this step: already in the pages
            k_pool[tables[i, p // PAGE], :, :, p % PAGE] = keys[i, p]
            v_pool[tables[i, p // PAGE], :, p % PAGE, :] = values[i, p]
        for p in range(length - n, length):
            pos.append(p)
            rows.append(i)
            slots.append(tables[i, p // PAGE] * PAGE + p % PAGE)
        cu.append(len(pos))
    t = len(pos) + pad
    pos_a = np.array(pos + [-1] * pad, np.int32)
    rows_a = np.array(rows + [0] * pad, np.int32)
    k_new = np.zeros((t, KVH, D), np.float32)
    v_new = np.zeros((t, KVH, D), np.float32)
    for j, (row, p) in enumerate(zip(rows, pos, strict=True)):
        k_new[j], v_new[j] = keys[row, p], values[row, p]
    step = StepInputs(jnp.asarray(pos_a), jnp.asarray(rows_a), jnp.asarray(cu, jnp.int32),
                      jnp.asarray([length for _, length in runs], jnp.int32), jnp.asarray(tables),
                      jnp.asarray(np.array(slots + [-1] * pad, np.int32)), jnp.arange(r, dtype=jnp.int32),
                      jnp.asarray([r], jnp.int32))
    q = rng.standard_normal((t, HEADS, D)).astype(np.float32)
    return (k_pool, v_pool), step, q, k_new, v_new, (keys, values, rows_a, pos_a, tables)


@functools.cache
def attend_fn(backend: XlaAttention, uniform, window, softcap, with_sinks: bool, stacked: bool):
    def run(pool, q, k, v, step, sinks):
        attention = backend.begin(step, uniform)
        return attention.attend(pool, 1 if stacked else None, q, k, v, scale=0.3, window=window, softcap=softcap,
                                sinks=sinks if with_sinks else None)

    return jax.jit(run, compiler_options=FAST_COMPILE_OPTIONS)  # many small programs: compiling dominates


def check(runs, *, uniform=None, window=None, softcap=None, sinks=None, stacked=False, backend=None, seed=0):
    backend = backend or XlaAttention(PAGE, kv_block=2, query_block=4)
    (k_pool, v_pool), step, q, k_new, v_new, (keys, values, rows, pos, tables) = build_step(runs, seed)
    pool = (jnp.asarray(k_pool), jnp.asarray(v_pool))
    if stacked:  # layer 1 of a 3-layer stack; layers 0 and 2 hold garbage that must not be read
        pool = tuple(jnp.stack([a + 50.0, a, a - 50.0]) for a in pool)
    sink_arr = jnp.asarray(sinks if sinks is not None else np.zeros(HEADS), jnp.float32)
    pool, out = attend_fn(backend, uniform, window, softcap, sinks is not None, stacked)(
        pool, q, k_new, v_new, step, sink_arr)
    want = dense_reference(q, keys, values, rows, pos, 0.3, window, softcap, sinks)
    np.testing.assert_allclose(np.asarray(out), want, atol=2e-5, rtol=1e-4)
    k_got = np.asarray(pool[0][1] if stacked else pool[0])
    for row, p in zip(rows, pos, strict=True):  # the step's k was written at its slot
        if p >= 0:
            np.testing.assert_array_equal(k_got[tables[row, p // PAGE], :, :, p % PAGE], keys[row, p])
    return out


def test_a_decode_step_reads_each_rows_own_pages():
    check([(1, 5), (1, 9), (1, 17), (1, 32)], uniform=(4, 1))


def test_a_ragged_step_of_chunks_one_token_rows_and_padding():
    check([(1, 5), (6, 9), (1, 17), (13, 30), (2, 2)])


def test_one_row_chunk_alone():
    check([(13, 30)], uniform=(1, 16))


def test_windows_softcap_and_sinks_follow_the_reference():
    runs = [(1, 5), (6, 13), (1, 29), (9, 31)]
    check(runs, window=6)
    check(runs, softcap=2.0)
    check(runs, sinks=np.array([0.5, -1.0, 2.0, 0.1]))
    check([(1, 5), (1, 29)], uniform=(2, 1), window=7, sinks=np.array([3.0, 0.0, -2.0, 1.0]))


def test_a_stacked_pool_reads_and_writes_only_its_layer():
    check([(1, 5), (6, 13), (1, 29)], stacked=True)


def test_unrolled_trips_give_the_while_loops_result():
    """`trip_counts` (what `bench/kv_reads.py` lowers for XLA's cost analysis) runs the same iterations."""
    runs = [(1, 30), (1, 3), (1, 17)]
    loop = check(runs, uniform=(3, 1))
    # items of 2 pages (8 positions): 4 + 1 + 3 = 8 items, 6 per iteration (2 per block): 2 trips
    unrolled = check(runs, uniform=(3, 1), backend=XlaAttention(PAGE, kv_block=2, query_block=4, trip_counts=(2,)))
    np.testing.assert_allclose(np.asarray(loop), np.asarray(unrolled), atol=1e-6)


@settings(max_examples=6, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(1, 9), st.integers(0, 22)), min_size=1, max_size=5),
       st.sampled_from([None, 5]))
def test_random_steps_match_the_reference(shape, window):
    """Any mix of query counts and lengths (a row's context is its queries plus up to 22 earlier positions)."""
    runs = [(n, n + extra) for n, extra in shape]
    check(runs, window=window, seed=len(runs))


@pytest.mark.parametrize("kv_block,query_block,long_block", [(1, 1, 4), (3, 2, 8), (8, 16, 4)])
def test_item_and_block_sizes_do_not_change_the_result(kv_block, query_block, long_block):
    """Any item size, and rows of more than 4 tokens in a third pass of long blocks."""
    backend = XlaAttention(PAGE, kv_block=kv_block, query_block=query_block, long_block=long_block, long_from=4)
    check([(1, 5), (6, 13), (1, 29), (9, 31), (3, 3)], backend=backend)
