"""Ragged paged attention in plain jnp: the portable backend (what CPU runs) and the test oracle.

Contract (`jaxchat.models.kv` states what a forward expects of a backend):
- Pool layout, per attention layer: keys [num_pages, KV, D, page_size] (stored transposed, so q.K is a plain
  batched matmul) and values [num_pages, KV, page_size, D]; a stacked pool adds a leading layer axis.
  Page 0 is never handed to a row (the engine's allocator keeps it back): padding reads it, masked.
- `XlaAttention(page_size, kv_block=8, decode_kv_block=None, iteration_bytes=None, query_block=16, long_block=128,
  long_from=64)`; `begin(step, uniform)`
  plans the step once per window (at trace time: the plans are device arrays computed inside the step
  program) and `attend` writes the new k/v at the step's write slots, then attends each query over its own
  row's pages only:
  * queries are grouped in blocks: one token per block in a decode step (`uniform` (R, 1)); otherwise
    rows of one token take one-token blocks (pass 1), rows of up to `long_from` tokens blocks of
    `query_block` tokens (pass 2), longer rows blocks of `long_block` (pass 3, in steps of more than
    `long_from` tokens), so a decode row beside a prompt chunk is not padded to a block and a long chunk
    reads each page once per `long_block` queries;
  * a work item is (query block, `kv_block` consecutive pages of the block's row; `decode_kv_block` for
    one-token blocks); a block has items from the page holding its earliest visible position (0, or
    position - window + 1) to its latest one;
  * a `lax.while_loop` runs ceil(items / G) iterations (G items each, static per program: 16 for query
    blocks; two per block for one-token blocks, bounded by `iteration_bytes` of keys, so an iteration's
    pages stay in a CPU core's cache: at 16 short rows that made the decode step's attention 4-5x faster
    on XLA:CPU than one iteration of 8-page items) with the online
    softmax (running max, sum and output per query), so the KV read per step is the rows' own lengths,
    rounded up to items, and no [T, S] score matrix of a whole context ever exists. Empty passes run
    no iteration.
- Numerics: scores and softmax in float32 (optionally soft-capped: tanh(s / cap) * cap), probabilities cast to
  the values' dtype for p.V; `sinks` [H] (gpt-oss) join each head's softmax denominator only. A query
  with no visible position (padding) gets 0.
- `trip_counts` (for analysis only, `bench/kv_reads.py`): run exactly that many iterations per pass as an
  unrolled loop, so XLA's cost analysis (which counts a while loop's body once) sees every iteration.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from jaxchat.models.kv import StepInputs

NEG = -1e30


def new_pool(num_pages: int, page_size: int, kv_heads: int, head_dim: int, dtype: Any,
             layers: int | None = None) -> tuple[jax.Array, jax.Array]:
    lead = () if layers is None else (layers,)
    return (jnp.zeros((*lead, num_pages, kv_heads, head_dim, page_size), dtype),
            jnp.zeros((*lead, num_pages, kv_heads, page_size, head_dim), dtype))


def write_kv(pool, layer, k, v, slots, page_size: int):
    """The pool with k, v [T, KV, D] written at slots (page * page_size + offset; -1: dropped)."""
    keys, values = pool
    n_pages = keys.shape[0 if layer is None else 1]
    page = jnp.where(slots >= 0, slots // page_size, n_pages)  # out of bounds: dropped
    off = jnp.where(slots >= 0, slots % page_size, 0)
    k, v = k.astype(keys.dtype), v.astype(values.dtype)
    if layer is None:
        return keys.at[page, :, :, off].set(k, mode="drop"), values.at[page, :, off, :].set(v, mode="drop")
    return (keys.at[layer, page, :, :, off].set(k, mode="drop"),
            values.at[layer, page, :, off, :].set(v, mode="drop"))


@functools.partial(jax.tree_util.register_dataclass, data_fields=["tokens", "rows", "positions"],
                   meta_fields=["identity"])
@dataclasses.dataclass(frozen=True)
class Blocks:
    """Query blocks of one pass: tokens [NB, Qb] (T = none), rows [NB], positions [NB, Qb] (-1 = none)."""

    tokens: jax.Array
    rows: jax.Array
    positions: jax.Array
    identity: bool = False  # tokens == arange(T)[:, None]: outputs need no scatter


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Items:
    """One pass's work items for one window, laid out per loop iteration (M iterations of G items), with what
    every layer shares precomputed: pages [M, G, kv_block], block [M, G], visible [M, G, Qb, span] (which
    positions each query of the item's block sees), weights [M, NB, G] (1 where the item is the block's),
    and the iterations that hold any item (`trips`)."""

    pages: jax.Array
    block: jax.Array
    visible: jax.Array
    weights: jax.Array
    trips: jax.Array


def decode_blocks(step: StepInputs) -> Blocks:
    t = step.positions.shape[0]
    return Blocks(jnp.arange(t, dtype=jnp.int32)[:, None], step.token_rows, step.positions[:, None], identity=True)


def single_token_blocks(step: StepInputs) -> Blocks:
    """Pass 1 of a ragged step: one block per row, its token when the row runs exactly one."""
    t = step.positions.shape[0]
    r = step.kv_lens.shape[0]
    rows = jnp.arange(r, dtype=jnp.int32)
    start = step.cu_q_lens[:-1]
    valid = (step.cu_q_lens[1:] - start == 1) & (rows < step.num_rows[0])
    tokens = jnp.where(valid, start, t)
    pos = jnp.where(valid, jnp.take(step.positions, jnp.minimum(tokens, t - 1)), -1)
    return Blocks(tokens[:, None], rows, pos[:, None])


def chunk_blocks(step: StepInputs, qb: int, shortest: int = 2, longest: int | None = None) -> Blocks:
    """A pass of a ragged step over the rows running `shortest` .. `longest` tokens (None: any more), cut in
    blocks of qb consecutive tokens."""
    t = step.positions.shape[0]
    r = step.kv_lens.shape[0]
    nb = t // qb + min(r, t // shortest)  # every such row adds at most one partial block
    q_len = step.cu_q_lens[1:] - step.cu_q_lens[:-1]
    rows = jnp.arange(r, dtype=jnp.int32)
    q_len = jnp.where(rows < step.num_rows[0], q_len, 0)
    taken = (q_len >= shortest) if longest is None else (q_len >= shortest) & (q_len <= longest)
    per_row = jnp.where(taken, (q_len + qb - 1) // qb, 0)
    cu = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(per_row).astype(jnp.int32)])
    b = jnp.arange(nb, dtype=jnp.int32)
    row = jnp.clip(jnp.searchsorted(cu, b, side="right").astype(jnp.int32) - 1, 0, r - 1)
    first = step.cu_q_lens[row] + (b - cu[row]) * qb
    tokens = first[:, None] + jnp.arange(qb, dtype=jnp.int32)[None, :]
    valid = (tokens < step.cu_q_lens[row + 1][:, None]) & (b < cu[-1])[:, None]
    tokens = jnp.where(valid, tokens, t)
    pos = jnp.where(valid, jnp.take(step.positions, jnp.minimum(tokens, t - 1)), -1)
    return Blocks(tokens, row, pos)


def key_page_bytes(keys) -> int:
    """Bytes of one page of a pool's keys (KV x D x page_size; `keys` of either layout)."""
    return keys.shape[-3] * keys.shape[-2] * keys.shape[-1] * keys.dtype.itemsize


def items_per_iteration(blocks: Blocks, item_bytes: int, iteration_bytes: int | None) -> int:
    """G, the items one loop iteration takes: for one-token blocks (decode rows) two per block, at most
    `iteration_bytes` of keys (None: no bound; at least one item); 16 for query blocks."""
    nb, qb = blocks.tokens.shape
    if qb != 1:
        return 16
    g = max(2, 2 * nb)
    return g if iteration_bytes is None else max(1, min(g, iteration_bytes // item_bytes))


def plan_items(blocks: Blocks, page_tables: jax.Array, page_size: int, kv_block: int,
               window: int | None, per_iter: int) -> Items:
    """The blocks' work items (see the module docstring), in iterations of `per_iter` items."""
    nb, qb = blocks.tokens.shape
    p = page_tables.shape[1]
    most = nb * -(-p // kv_block)  # every block reading its whole row
    m = -(-most // per_iter)
    n = m * per_iter
    span = kv_block * page_size  # positions per item
    valid = blocks.positions >= 0
    any_valid = valid.any(axis=1)
    hi = jnp.max(jnp.where(valid, blocks.positions, 0), axis=1)
    lo = jnp.min(jnp.where(valid, blocks.positions, jnp.iinfo(jnp.int32).max), axis=1)
    lo = jnp.zeros_like(lo) if window is None else jnp.maximum(lo - window + 1, 0)
    first = jnp.where(any_valid, lo // span, 0)
    count = jnp.where(any_valid, hi // span - first + 1, 0)
    cu = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(count).astype(jnp.int32)])
    i = jnp.arange(n, dtype=jnp.int32)
    block = jnp.clip(jnp.searchsorted(cu, i, side="right").astype(jnp.int32) - 1, 0, nb - 1)
    kb = first[block] + i - cu[block]
    cols = jnp.clip(kb[:, None] * kv_block + jnp.arange(kv_block, dtype=jnp.int32)[None, :], 0, p - 1)
    ok = i < cu[-1]
    pages = jnp.where(ok[:, None], page_tables[blocks.rows[block][:, None], cols], 0)
    kvpos = (kb * span)[:, None] + jnp.arange(span, dtype=jnp.int32)[None, :]  # [N, span]
    qpos = blocks.positions[block]  # [N, Qb]
    visible = (kvpos[:, None, :] <= qpos[:, :, None]) & (qpos >= 0)[:, :, None] & ok[:, None, None]
    if window is not None:
        visible = visible & (kvpos[:, None, :] > qpos[:, :, None] - window)
    weights = ((block[None, :] == jnp.arange(nb, dtype=jnp.int32)[:, None]) & ok[None, :]).astype(jnp.float32)
    return Items(pages.reshape(m, per_iter, kv_block), block.reshape(m, per_iter),
                 visible.reshape(m, per_iter, qb, span),
                 weights.reshape(nb, m, per_iter).transpose(1, 0, 2), (cu[-1] + per_iter - 1) // per_iter)


@functools.partial(jax.jit, static_argnames=("page_size", "scale", "softcap", "trips"))
def attend_blocks(q, pool, layer, blocks: Blocks, items: Items, *, page_size: int, scale: float,
                  softcap: float | None, sinks, trips: int | None = None):
    """Attention of the blocks' queries (q [T, H, D]) over their items -> [NB, Qb, H, D] (float32). A nested
    `jit`: every layer of a step calls it with the same shapes, so it is traced and lowered once per pass, not
    once per layer (XLA inlines the calls: the program is the same)."""
    keys_all, values_all = pool
    t, h, d = q.shape
    kvh = keys_all.shape[-3]
    g = h // kvh
    nb, qb = blocks.tokens.shape
    per_iter, kvb = items.pages.shape[1:]
    span = kvb * page_size
    qpad = jnp.concatenate([q.reshape(t, kvh, g, d), jnp.zeros((1, kvh, g, d), q.dtype)])
    qblk = qpad[blocks.tokens].transpose(0, 2, 1, 3, 4).reshape(nb, kvh, qb * g, d)

    def body(i, carry):
        m, denom, acc = carry
        pages, ib, vis, weights = items.pages[i], items.block[i], items.visible[i], items.weights[i]
        if layer is None:
            kc, vc = keys_all[pages], values_all[pages]  # [G, kvb, KV, D, page], [G, kvb, KV, page, D]
        else:
            kc, vc = keys_all[layer, pages], values_all[layer, pages]
        kc = kc.transpose(0, 2, 3, 1, 4).reshape(per_iter, kvh, d, span)
        s = jax.lax.dot_general(qblk[ib], kc.astype(q.dtype), (((3,), (2,)), ((0, 1), (0, 1))),
                                preferred_element_type=jnp.float32) * scale  # [G, KV, Qb*g, span]
        if softcap is not None:
            s = jnp.tanh(s / softcap) * softcap
        vis = vis[:, None, :, None, :]
        s = jnp.where(vis, s.reshape(per_iter, kvh, qb, g, span), NEG)
        m_item = s.max(axis=-1)  # [G, KV, Qb, g]
        m_new = jnp.maximum(m, jnp.where(weights[:, :, None, None, None] > 0, m_item[None], NEG).max(axis=1))
        p = jnp.where(vis, jnp.exp(s - m_new[ib][..., None]), 0.0)
        vc = vc.transpose(0, 2, 1, 3, 4).reshape(per_iter, kvh, span, d)
        o = jax.lax.dot_general(p.reshape(per_iter, kvh, qb * g, span).astype(vc.dtype), vc,
                                (((3,), (2,)), ((0, 1), (0, 1))), preferred_element_type=jnp.float32)
        alpha = jnp.exp(m - m_new)
        denom = denom * alpha + jnp.einsum("bn,nkqg->bkqg", weights, p.sum(axis=-1))
        acc = acc * alpha[..., None] + jnp.einsum("bn,nkqgd->bkqgd", weights, o.reshape(per_iter, kvh, qb, g, d))
        return m_new, denom, acc

    m = jnp.full((nb, kvh, qb, g), NEG, jnp.float32)
    carry = (m, jnp.zeros_like(m), jnp.zeros((nb, kvh, qb, g, d), jnp.float32))
    if trips is None:
        _, m, denom, acc = jax.lax.while_loop(lambda c: c[0] < items.trips, lambda c: (c[0] + 1, *body(c[0], c[1:])),
                                          (jnp.int32(0), *carry))
    else:
        for i in range(trips):
            carry = body(jnp.int32(i), carry)
        m, denom, acc = carry
    if sinks is not None:
        sink = sinks.astype(jnp.float32).reshape(1, kvh, 1, g)
        m_f = jnp.maximum(m, sink)
        rescale = jnp.exp(m - m_f)
        denom = denom * rescale + jnp.exp(sink - m_f)
        acc = acc * rescale[..., None]
    out = jnp.where(denom[..., None] > 0, acc / jnp.where(denom > 0, denom, 1.0)[..., None], 0.0)
    return out.transpose(0, 2, 1, 3, 4).reshape(nb, qb, h, d)


@dataclasses.dataclass(frozen=True)
class XlaAttention:
    """The jnp backend (see the module docstring). Static: page size, pages per work item, query block."""

    page_size: int
    kv_block: int = 8
    decode_kv_block: int | None = None  # pages per item of one-token blocks (None: kv_block)
    iteration_bytes: int | None = None  # keys one iteration of one-token blocks reads at most (None: no bound)
    query_block: int = 16
    long_block: int = 128
    long_from: int = 64
    name: str = "xla"
    pool_head_axis: int = 1  # the kv-head axis of a per-layer pool (a stacked one: + 1)
    trip_counts: tuple[int, ...] | None = None  # analysis only: unrolled iterations per pass

    def new_pool(self, num_pages: int, page_size: int, kv_heads: int, head_dim: int, dtype: Any,
                 layers: int | None = None):
        if page_size != self.page_size:
            raise ValueError(f"pool pages of {page_size} tokens for a backend of {self.page_size}")
        return new_pool(num_pages, page_size, kv_heads, head_dim, dtype, layers)

    def kv_block_of(self, blocks: Blocks) -> int:
        """Pages per work item of a pass: `decode_kv_block` for one-token blocks, else `kv_block`."""
        one = blocks.tokens.shape[1] == 1 and self.decode_kv_block is not None
        return self.decode_kv_block if one else self.kv_block

    def begin(self, step: StepInputs, uniform: tuple[int, int] | None = None) -> XlaStepAttention:
        if uniform is not None and uniform[1] == 1:
            passes = (decode_blocks(step),)
        else:
            t, long_from = step.positions.shape[0], self.long_from
            passes = (single_token_blocks(step), chunk_blocks(step, self.query_block, 2, long_from if t > long_from
                                                                else None))
            if t > long_from:  # long chunks: larger query blocks, so each block's pages are read fewer times
                passes += (chunk_blocks(step, self.long_block, long_from + 1),)
        return XlaStepAttention(self, step, uniform, passes)


class XlaStepAttention:
    """One step's plans (per window, built when first asked for) and the layers' attention over them."""

    def __init__(self, backend: XlaAttention, step: StepInputs, uniform, passes: tuple[Blocks, ...]):
        self.backend, self.step, self.uniform, self.passes = backend, step, uniform, passes
        self._items: dict[int | None, tuple[Items, ...]] = {}

    def items(self, window: int | None, pool) -> tuple[Items, ...]:
        if window not in self._items:
            b = self.backend
            plans = []
            for blocks in self.passes:
                kv_block = b.kv_block_of(blocks)
                per_iter = items_per_iteration(blocks, kv_block * key_page_bytes(pool[0]), b.iteration_bytes)
                plans.append(plan_items(blocks, self.step.page_tables, b.page_size, kv_block, window, per_iter))
            self._items[window] = tuple(plans)
        return self._items[window]

    def attend(self, pool, layer, q, k, v, *, scale: float, window: int | None = None,
               softcap: float | None = None, sinks=None, local=None):
        """Write k/v (unless None) at the step's write slots, then attend q [T, H, D] -> (pool, [T, H, D]).
        `local` (a traced bool): the window applies only where it is true (a scanned stack of both kinds)."""
        b = self.backend
        if k is not None:
            pool = write_kv(pool, layer, k, v, self.step.write_slots, b.page_size)
        t, h, d = q.shape
        plans = self.items(window, pool)
        if local is not None and window is not None:  # a scanned stack of both kinds: this layer's plan
            full = self.items(None, pool)
            plans = tuple(jax.tree.map(lambda a, f: jnp.where(local, a, f), p, f) for p, f in zip(plans, full, strict=True))
        out = None
        for i, (blocks, items) in enumerate(zip(self.passes, plans, strict=True)):
            part = attend_blocks(q, pool, layer, blocks, items, page_size=b.page_size, scale=scale, softcap=softcap,
                                 sinks=sinks, trips=None if b.trip_counts is None else b.trip_counts[i])
            if blocks.identity:
                out = part.reshape(t, h, d)
                continue
            if out is None:
                out = jnp.zeros((t + 1, h, d), jnp.float32)
            out = out.at[blocks.tokens.reshape(-1)].set(part.reshape(-1, h, d))
        out = out if out.shape[0] == t else out[:t]
        return pool, out.astype(q.dtype)
