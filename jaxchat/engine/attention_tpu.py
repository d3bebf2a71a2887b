"""The TPU attention backend of the paged KV pool: JAX's Pallas `ragged_paged_attention` kernel behind a small API.

Contract (one attention layer; T = tokens of the step, R = rows, KV = kv heads, D = head_dim):
- Pool layout (the kernel's own): `kv_pages [num_pages, page_size, 2 * KV, D]`, keys and values interleaved on the
  head axis: combined head `2 * h` is kv head h's key, `2 * h + 1` its value. A token's slot is
  `page_id * page_size + offset`.
- `new_pool(num_pages, page_size, num_kv_heads, head_dim, dtype)`: zeros in that layout.
- `write_kv(kv_pages, k, v, slots)`: k, v `[T, KV, D]`; slots `int32[T]`, -1 for a padding token (dropped);
  returns the updated pool (one scatter; jit it with the pool donated to update in place). Slots of real tokens
  must be distinct.
- `ragged_attention(q, kv_pages, kv_lens, page_tables, cu_q_lens, num_seqs, *, scale, ...)`: q `[T, H, D]` with
  row i's queries at `q[cu_q_lens[i]:cu_q_lens[i + 1]]`, the LAST `q_len` positions of its `kv_lens[i]` context
  (their K/V already written); `kv_lens int32[R]`, `page_tables int32[R, pages_per_seq]` (every entry a valid page
  id, unused ones too), `cu_q_lens int32[R + 1]`, `num_seqs int32[1]` (rows `>= num_seqs` are ignored). Query at
  position p sees kv positions `<= p` (and `> p - sliding_window` with a window); logits are `q.k * scale`, then
  `soft_cap * tanh(logits / soft_cap)` with a cap. Returns `[T, H, D]` in q's dtype; rows of padding tokens (index
  `>= cu_q_lens[num_seqs]`) are zero. Needs `q_len <= kv_len` per row, D a multiple of 128 (the kernel's
  lane-wide scratch) and kv heads the kernel tiles (`tiling_problem`: f32 pools 1, 2, 4 or a multiple of 4; bf16
  pools 1, 2, 4, 8 or a multiple of 8). Block sizes: `block_sizes(..., chip, vmem_limit_bytes)`, the kernel's
  tuned table for that chip generation (its default, 128 pages and 32 queries, without one), clipped to the
  step, pages per block halved until the kernel's VMEM (`vmem_bytes`) is within half the limit; both may be
  overridden. `page_size_for(max_context)`: the TPU page size, the kernel's guidance within 128..256.
- `unsupported(config, dtype, shards)`: why the kernel cannot run a model's attention with its heads over
  `shards` devices, or None.
- `PallasAttention(page_size, interpret=False, mesh=None, chip=None)` is the same kernel as an attention backend
  of the engine's step (`jaxchat.models.kv`): its pools, and a step attention whose `attend` writes the step's
  k/v and runs the kernel over the step's rows (no sinks: gpt-oss stays on the jnp backend); on a mesh of several
  devices both under `jax.shard_map` over the mesh axis (query heads and the pool's kv heads split: the pool is
  sharded on its kv-head axis, `pool_head_axis`), with the chip's `vmem_limit_bytes`.
- `interpret=True` raises NotImplementedError: with jax 0.10.2 the kernel cannot run under Pallas' TPU interpret
  mode (docs/pallas_interpret.md). On CPU use `ragged_attention_reference`, same signature, built on JAX's
  `ref_ragged_paged_attention`: it needs concrete lengths (it loops over rows in Python, one jit per call), so it
  is for tests, not for use inside a jitted step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import kernel as _rpa
from jax.experimental.pallas.ops.tpu.ragged_paged_attention import tuned_block_sizes as _tuned
from jax.sharding import PartitionSpec as P

INTERPRET_UNSUPPORTED = (
    "ragged_paged_attention cannot run under Pallas TPU interpret mode with jax 0.10.2: the kernel reshapes a "
    "VMEM scratch ref (kernel.py, `cur_async_copy_kv.wait().reshape(...)`) and strided-loads through it, and the "
    "interpreter's load path handles only indexer ref transforms (AttributeError: 'ReshapeTransform' object has no "
    "attribute 'indices'). Use ragged_attention_reference on CPU; see docs/pallas_interpret.md."
)


def new_pool(num_pages: int, page_size: int, num_kv_heads: int, head_dim: int, dtype=jnp.bfloat16) -> jax.Array:
    """One layer's pool of zeros, `[num_pages, page_size, 2 * num_kv_heads, head_dim]`."""
    return jnp.zeros((num_pages, page_size, 2 * num_kv_heads, head_dim), dtype)


def write_kv(kv_pages: jax.Array, k: jax.Array, v: jax.Array, slots: jax.Array) -> jax.Array:
    """Scatter the step's keys and values `[T, KV, D]` into their slots; slot -1 (padding) is dropped."""
    num_pages, page_size, combined, head_dim = kv_pages.shape
    num_tokens, num_kv_heads, _ = k.shape
    if combined != 2 * num_kv_heads or k.shape != v.shape or k.shape[2] != head_dim:
        raise ValueError(f"k {k.shape} / v {v.shape} do not fit the pool {kv_pages.shape}")
    kv = jnp.stack([k, v], axis=2).reshape(num_tokens, combined, head_dim).astype(kv_pages.dtype)
    flat = kv_pages.reshape(num_pages * page_size, combined, head_dim)
    # `.at[]` wraps negative indices, so padding goes to an index past the end, which mode="drop" drops.
    slots = jnp.where(slots < 0, num_pages * page_size, slots)
    return flat.at[slots].set(kv, mode="drop").reshape(kv_pages.shape)


def tiling_problem(num_q_heads: int, num_kv_heads: int, q_dtype, kv_dtype) -> str | None:
    """Why the kernel cannot tile these heads (one chip's share of them), or None. The pool's combined k/v heads
    (2 * KV) are packed `32 // bits` to a 32-bit row (bf16: 2), and the packed count must be 1, 2, 4, 8 or a
    multiple of 8: for bf16 pools KV in {1, 2, 4, 8} or a multiple of 8, for f32 pools 2 * KV so."""
    combined, packing = 2 * num_kv_heads, 4 // jnp.dtype(kv_dtype).itemsize
    rows = combined // packing
    if combined % packing or not (rows in (1, 2, 4, 8) or rows % 8 == 0):
        return (f"{num_kv_heads} kv heads in a {jnp.dtype(kv_dtype).name} pool: the kernel tiles "
                f"{'1, 2, 4, 8 or a multiple of 8' if packing == 2 else '1, 2, 4 or a multiple of 4'}")
    if num_q_heads % num_kv_heads:
        return f"{num_q_heads} query heads do not group over {num_kv_heads} kv heads"
    return None


def vmem_bytes(q_dtype, kv_dtype, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
               kv_pages_per_block: int, queries_per_block: int) -> int:
    """The VMEM one kernel call holds (one chip's heads): the double buffer of KV pages, the double-buffered query
    and output blocks, the f32 accumulator and the running max/sum scratch (lane-wide)."""
    heads_blk, combined_blk = _rpa.get_min_heads_per_blk(num_q_heads, 2 * num_kv_heads, q_dtype, kv_dtype)
    kv_item, q_item = jnp.dtype(kv_dtype).itemsize, jnp.dtype(q_dtype).itemsize
    ratio = num_q_heads // num_kv_heads
    double_buf = 2 * kv_pages_per_block * page_size * combined_blk * head_dim * kv_item
    q_blocks = 2 * 2 * queries_per_block * heads_blk * head_dim * q_item  # q in, out: each double-buffered
    acc = queries_per_block * heads_blk * head_dim * 4
    lm = 2 * (combined_blk // 2) * queries_per_block * ratio * 128 * 4
    return double_buf + q_blocks + acc + lm


def _tuned_sizes(chip, q_dtype, kv_dtype, heads_blk: int, kv_heads_blk: int, head_dim: int, page_size: int,
           num_tokens: int, pages_per_seq: int) -> tuple[int, int]:
    """The kernel's tuned (pages, queries) per block for `chip` (its default where the table has no entry)."""
    key = _tuned.simplify_key((q_dtype, kv_dtype, heads_blk, kv_heads_blk, head_dim, page_size, num_tokens,
                               pages_per_seq))
    return _tuned.TUNED_BLOCK_SIZES.get(chip.tuned_name, {}).get(key, (128, 32))


def block_sizes(q_dtype, kv_dtype, num_q_heads: int, num_kv_heads: int, head_dim: int, page_size: int,
                num_tokens: int, pages_per_seq: int, chip=None, vmem_limit_bytes: int | None = None
                ) -> tuple[int, int]:
    """(num_kv_pages_per_block, num_queries_per_block): the kernel's tuned table for `chip` (a `chips.Chip`;
    None: the kernel's default, 128 pages and 32 queries), clipped to the step, then pages halved until the
    kernel's VMEM (`vmem_bytes`) is within half of `vmem_limit_bytes` (headroom for the compiler's own)."""
    heads_blk, combined_blk = _rpa.get_min_heads_per_blk(num_q_heads, 2 * num_kv_heads, q_dtype, kv_dtype)
    pages, queries = (128, 32) if chip is None else _tuned_sizes(chip, q_dtype, kv_dtype, heads_blk, combined_blk // 2,
                                                           head_dim, page_size, num_tokens, pages_per_seq)
    pages, queries = min(pages_per_seq, pages), min(num_tokens, queries)
    if vmem_limit_bytes is not None:
        while pages > 1 and 2 * vmem_bytes(q_dtype, kv_dtype, num_q_heads, num_kv_heads, head_dim, page_size,
                                           pages, queries) > vmem_limit_bytes:
            pages //= 2
    return pages, queries


def page_size_for(max_context: int) -> int:
    """The TPU page size for a context: the kernel's guidance (`get_min_page_size`: at most 16 pages a
    sequence) within 128..256."""
    return min(max(_tuned.get_min_page_size(max_context), 128), 256)


def _zero_padding(out: jax.Array, cu_q_lens: jax.Array, num_seqs: jax.Array) -> jax.Array:
    real = jnp.arange(out.shape[0])[:, None, None] < cu_q_lens[num_seqs[0]]
    return jnp.where(real, out, jnp.zeros_like(out))


def ragged_attention(q: jax.Array, kv_pages: jax.Array, kv_lens: jax.Array, page_tables: jax.Array,
                     cu_q_lens: jax.Array, num_seqs: jax.Array, *, scale: float, sliding_window: int | None = None,
                     soft_cap: float | None = None, interpret: bool = False,
                     num_kv_pages_per_block: int | None = None, num_queries_per_block: int | None = None,
                     vmem_limit_bytes: int | None = None, chip=None) -> jax.Array:
    """Attention of the step's ragged rows over the paged pool with the Pallas kernel (see the module contract)."""
    if interpret:
        raise NotImplementedError(INTERPRET_UNSUPPORTED)
    num_tokens, num_q_heads, head_dim = q.shape
    _, page_size, combined, _ = kv_pages.shape
    if head_dim % 128:
        raise ValueError(f"head_dim {head_dim}: the kernel needs a multiple of 128")
    pages_per_seq = page_tables.shape[1]
    tuned = block_sizes(q.dtype, kv_pages.dtype, num_q_heads, combined // 2, head_dim, page_size, num_tokens,
                        pages_per_seq, chip=chip, vmem_limit_bytes=vmem_limit_bytes)
    out = _rpa.ragged_paged_attention(
        q, kv_pages, kv_lens, page_tables, cu_q_lens, num_seqs, sm_scale=float(scale),
        sliding_window=sliding_window, soft_cap=None if soft_cap is None else float(soft_cap),
        num_kv_pages_per_block=num_kv_pages_per_block or tuned[0],
        num_queries_per_block=num_queries_per_block or tuned[1], vmem_limit_bytes=vmem_limit_bytes)
    return _zero_padding(out, cu_q_lens, num_seqs)


def ragged_attention_reference(q: jax.Array, kv_pages: jax.Array, kv_lens: jax.Array, page_tables: jax.Array,
                               cu_q_lens: jax.Array, num_seqs: jax.Array, *, scale: float,
                               sliding_window: int | None = None, soft_cap: float | None = None,
                               interpret: bool = False) -> jax.Array:
    """`ragged_attention`'s result from JAX's `ref_ragged_paged_attention` (concrete lengths only), padded to T."""
    del interpret  # same signature as ragged_attention; the reference is plain XLA
    kv_lens, cu_q_lens, num_seqs = (np.asarray(a, np.int32) for a in (kv_lens, cu_q_lens, num_seqs))
    if num_seqs[0] == 0:
        return jnp.zeros_like(q)

    @jax.jit
    def run(q, kv_pages, page_tables):  # the lengths are constants here: the reference loops over rows in Python
        ref = _rpa.ref_ragged_paged_attention(
            q, kv_pages, kv_lens, page_tables, cu_q_lens, num_seqs, sm_scale=float(scale),
            sliding_window=sliding_window, soft_cap=None if soft_cap is None else float(soft_cap))
        return jnp.zeros_like(q).at[: ref.shape[0]].set(ref.astype(q.dtype))

    return run(q, kv_pages, page_tables)


class PallasStepAttention:
    """One step's attention through the kernel (`PallasAttention.begin`)."""

    uniform = None

    def __init__(self, backend: PallasAttention, step, uniform) -> None:
        self.backend, self.step, self.uniform = backend, step, uniform

    def attend(self, pool, layer, q, k, v, *, scale: float, window: int | None = None, softcap: float | None = None,
               sinks=None, local=None):
        """Write k/v (unless None) at the step's write slots, then the kernel over the rows' pages -> (pool, out);
        on a mesh of several devices both run under `shard_map`, each device on its share of the heads."""
        if sinks is not None or local is not None:
            raise NotImplementedError("the Pallas kernel has no attention sinks and no per-layer window switch: "
                                      "use the xla attention backend for this model")
        b, s = self.backend, self.step
        layer_pool = pool if layer is None else pool[layer]

        def local_attend(layer_pool, q, k, v, write_slots, kv_lens, page_tables, cu_q_lens, num_rows):
            if k is not None:
                layer_pool = write_kv(layer_pool, k, v, write_slots)
            out = ragged_attention(q, layer_pool, kv_lens, page_tables, cu_q_lens, num_rows, scale=scale,
                                   sliding_window=window, soft_cap=softcap, chip=b.chip,
                                   vmem_limit_bytes=None if b.chip is None else b.chip.vmem_limit_bytes)
            return layer_pool, out

        args = (layer_pool, q, k, v, s.write_slots, s.kv_lens, s.page_tables, s.cu_q_lens, s.num_rows)
        if b.mesh is not None and b.mesh.devices.size > 1:
            heads, rep = P(None, b.axis, None), P()
            local_attend = jax.shard_map(
                local_attend, mesh=b.mesh, check_vma=False, out_specs=(P(None, None, b.axis, None), heads),
                in_specs=(P(None, None, b.axis, None), heads, None if k is None else heads,
                          None if v is None else heads, rep, rep, rep, rep, rep))
        layer_pool, out = local_attend(*args)
        if k is not None:
            pool = layer_pool if layer is None else pool.at[layer].set(layer_pool)
        return pool, out


class PallasAttention:
    """The kernel as an attention backend (`jaxchat.models.kv.AttentionBackend`): pools in the kernel's layout (a
    stacked pool adds a leading layer axis; a layer's view of it is a copy, so per-layer pools are preferred), the
    engine's step inputs passed as the kernel takes them (rows' tokens contiguous, each row's queries the last of
    its context, `num_rows` rows in use, page 0 in every unused table entry). `mesh` (several devices): the
    kernel runs under `shard_map` over its `axis`, query heads and the pool's combined k/v heads split (kv heads
    must divide by the device count: `unsupported(config, shards=...)`); `chip` (`chips.Chip`): its tuned block
    sizes and `vmem_limit_bytes` (None: the kernel's defaults). `interpret=True` (off TPU): the kernel runs under
    Pallas' TPU interpreter, patched for the rest of the process (`pallas_interpret.enable`): slow and exact, for
    checking this path on CPU. `pool_head_axis`: the kv-head axis of a per-layer pool (a stacked one: + 1)."""

    name = "pallas"
    pool_head_axis = 2

    def __init__(self, page_size: int, interpret: bool = False, mesh=None, chip=None, axis: str = "tp") -> None:
        self.page_size, self.interpret, self.mesh, self.chip, self.axis = page_size, interpret, mesh, chip, axis
        if interpret:
            from jaxchat.engine import pallas_interpret

            pallas_interpret.enable()

    def _key(self) -> tuple:
        shards = 1 if self.mesh is None else self.mesh.devices.size
        return ("pallas", self.page_size, self.interpret, shards, None if self.chip is None else self.chip.name)

    def __repr__(self) -> str:
        _, page, interpret, shards, chip = self._key()
        return f"PallasAttention(page_size={page}, interpret={interpret}, shards={shards}, chip={chip})"

    def __eq__(self, other) -> bool:
        return isinstance(other, PallasAttention) and other._key() == self._key() and other.mesh == self.mesh

    def __hash__(self) -> int:
        return hash(self._key())

    def new_pool(self, num_pages: int, page_size: int, kv_heads: int, head_dim: int, dtype, layers: int | None = None):
        pool = new_pool(num_pages, page_size, kv_heads, head_dim, dtype)
        return pool if layers is None else jnp.broadcast_to(pool, (layers, *pool.shape)).copy()

    def begin(self, step, uniform=None) -> PallasStepAttention:
        return PallasStepAttention(self, step, uniform)


def unsupported(config, dtype="bfloat16", shards: int = 1) -> str | None:
    """Why the kernel cannot run a model's attention with its heads split over `shards` devices and a pool of
    `dtype` (None: it can): head dims a multiple of 128, kv heads that divide by the shards and that the kernel
    tiles (`tiling_problem`, one device's share), no attention sinks."""
    dims = {config.head_dim, config.global_head_dim or config.head_dim}
    if any(d % 128 for d in dims):
        return f"head_dim {sorted(dims)}: the kernel needs a multiple of 128"
    if config.attention_sinks:
        return "attention sinks (gpt-oss): the kernel has none"
    for kv in {config.num_kv_heads, config.num_global_kv_heads or config.num_kv_heads}:
        if kv % shards:
            return f"{kv} kv heads do not divide over {shards} devices"
        why = tiling_problem(config.num_heads // shards, kv // shards, dtype, dtype)
        if why is not None:
            return why
    return None
