"""The jitted device programs: bucketed prefill into one slot, batched decode, slot moves.

Contract:
- The runner runs the model as its `StepModel` (`jaxchat.models.StepModel`, built by the model for the
  devices' platform) describes it: the layout, the params in that layout, the forward, the cache builder,
  whether the forward takes attention spans, and the optional vocab-major head builder. Nothing is probed.
- Device state (`DecodeState`, donated into every program) holds the KV cache in the model's layout
  (stacked: `[layers, max_batch, max_context, kv_heads, head_dim]`), per-row generated-token counts
  int32[max_batch, V] and per-row prompt-token masks bool[max_batch, V] (for the penalties).
- `decode(tokens[b], positions[b], bitmask[b, W], sampling[b])` runs on slots `0..b-1` for a batch bucket
  `b`: one forward token per row (position -1 = idle row: nothing written, output ignored), then the
  masked sampler (`sampler.sample`) in the same XLA program; counts of active rows are updated. Bitmasks
  have the layout of `jaxchat.bitmask`, W = `mask_words(V)` words per row.
- `prefill(slot, prompt_ids, bitmask[1, W], sampling[1], start=0, prompt_len=None)` runs the prompt from
  position `start` on (positions 0..start-1 of `slot` must already hold the K/V of prompt_ids[:start]: a
  reused prefix), padded to a length bucket, writes its K/V into `slot`, resets the slot's counts and sets
  its prompt mask to prompt_ids[:prompt_len] (tokens after it are forced output text, counted), and samples
  the first token through the same masked sampler. `extend(slot, tokens, start, bitmask, sampling)` runs
  several tokens into a running row through the same program (jump-forward), keeping the row's counts and
  prompt mask.  `move(src, dst)`
  copies one slot's rows and `swap(a, b)` exchanges two (the scheduler keeps active slots compact): a row
  read out, a move, the row written back, each in place.
- Only bucket shapes are ever traced: `warmup()` compiles every bucket ahead of time (lowered for the exact
  arguments a call passes); after it, no call compiles anything. It also runs the small programs once
  (`PRIME_TOKENS`): on XLA:CPU a program's first run is slower than the next ones.  Sampling parameters are arrays.
- Attention spans: with `span_buckets` (and `StepModel.attention_spans`), each decode attends over
  the smallest span bucket above every row's position instead of all of max_context: one decode program
  per (batch bucket, span bucket).
- The forward writes and reads the cache rows in place (`row_offset`: decode uses rows 0..b-1 of the full
  cache, prefill row `slot`), and prefill asks for the last prompt token's logits only (`logits_index`).
- On CPU a `LoadedModel` describes the "unrolled" layout: per-layer weights (zero-copy views) and a
  per-layer cache cut at the span buckets (`new_cache(batch, max_len, spans)`), so the forward unrolls the
  layer loop (XLA on CPU copies a layer's weights out of a stacked array on every step otherwise) and a
  span reads whole chunk buffers (a prefix sliced out of one buffer is a copy).  On accelerators it
  describes the "stacked" layout, scanned (one compact program, no extra weight memory).
- With a `StepModel.vocab_major_head` builder (a `LoadedModel` on CPU), decode buckets of more than one
  row compute the logits from a vocab-major copy of the lm head (kept next to the params under
  "head_vd"): XLA:CPU's GEMM runs [V, d] . x^T ~1.5x faster than x . [d, V] at 16 rows, while one row is
  faster the other way. It costs one more copy of the head in memory.
- Mixed steps (`prefill_chunk` T > 0 and `StepModel.mixed_steps`): `mixed(tokens[b], positions[b], rows,
  bitmask[b + k, W], sampling[b + k], shape)` runs one decode token for each of rows 0..b-1 and a prompt chunk
  for each of k rows (rows[i] = (slot, chunk, start, prompt or None, count_from, final)) in ONE forward
  (`StepModel.forward(mixed=(b, K, C))`: the weights are read once for all of them), then samples every row
  through the same masked sampler (a chunk row's sample is the token after its chunk, used only when the chunk
  ends its prompt, `final`). The chunk rows lie within K consecutive cache rows and keep position -1 among
  the decode rows; the other rows of those K run padding (nothing written, counts and prompt masks kept).
  A chunk row given its `prompt` (its first chunk) has its counts reset and its prompt mask set, as prefill
  does. Shapes: the decode part has the largest batch bucket (`mixed_buckets`) and an attention span
  bucket; the chunk part one of `mixed_shapes` (K rows -> chunk lengths C, K * C <= T: the per-step token
  budget): 1 row and the `prefill_batches` row buckets, each with C = T / K or 1 token.
- Batched prefills (`prefill_batches`, for models whose forward runs mixed steps: positional caches, every
  row on its own): `prefill_rows(slot, rows, bitmask[k, W], sampling[k])` prefills k prompts (rows[i] =
  (tokens, start, prompt_len), as `prefill` takes them) into rows slot..slot+k-1 in ONE program of
  [kb, t] tokens: kb the smallest `prefill_batches` bucket >= k, t a length bucket with
  kb * t <= `PREFILL_BATCH_TOKENS` (`rows_bucket` says which fits). Padding rows
  (the bucket's rows past k; the program may start below `slot` to stay inside the cache) write nothing
  and keep their counts and prompt masks. A burst of arrivals then costs one weight read, not one each.
- `keep_prefixes` (and `StepModel.prefix_reuse`): the scheduler reuses idle rows' prefixes, so warm-up
  also compiles the programs `swap` runs; `runner.keep_prefixes` says whether it is on.
- Row moves (`move(src, dst, extent)`, `swap(a, b, extent)`): `extent` says how many leading positions hold
  anything that matters (None: all). In the unrolled layout of a positional cache, only the chunk buffers
  below the smallest span bucket >= extent are copied (`move_extents`; `row_moves` has the programs, a
  move and, with prefix reuse, a swap's read and write per extent): placing a
  conversation of 100 tokens moves 128 positions of the row, not all of max_context.
- Sharding: params keep the shardings they arrive with (on a multi-process mesh, global arrays: every process
  runs the same programs, see `step_link`, and reads the replicated outputs locally); the cache is sharded over kv heads on the mesh
  axis "tp" when divisible, everything else is replicated; on one device the mesh has one device.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxchat.bitmask import mask_words
from jaxchat.engine import row_moves
from jaxchat.engine.executables import ExecutableStore
from jaxchat.engine.sampler import SampleOut, SamplingArrays, sample
from jaxchat.models.base import StepModel


class DecodeState(NamedTuple):
    cache_k: Any  # stacked [layers, max_batch, S, kv, hd], or (unrolled) per layer a tuple of chunks [max_batch, kv, hd, w]
    cache_v: Any  # stacked like cache_k, or (unrolled) per layer a tuple of chunks [max_batch, kv, w, hd]
    counts: jax.Array  # i32[max_batch, V]
    prompt_mask: jax.Array  # bool[max_batch, V]


def pow2_buckets(lo: int, hi: int) -> tuple[int, ...]:
    out, b = [], lo
    while b < hi:
        out.append(b)
        b *= 2
    out.append(hi)
    return tuple(out)


def default_span_buckets(max_context: int, count: int = 3, smallest: int = 64) -> tuple[int, ...]:
    """Attention spans for decode: max_context and up to count - 1 halvings of it, none below `smallest`."""
    spans = {max_context}
    for i in range(1, count):
        if max_context >> i >= smallest:
            spans.add(max_context >> i)
    return tuple(sorted(spans))


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    for b in buckets:
        if n <= b:
            return b
    raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


def mixed_shapes(budget: int, row_buckets: Sequence[int], max_batch: int) -> dict[int, tuple[int, ...]]:
    """The chunk part's shapes of mixed steps: K rows -> chunk lengths C (largest first), K * C <= `budget`
    tokens. K is 1 and each of `row_buckets` up to max_batch and the budget; C is budget // K, or 1 (a burst
    of one-token continuations, what prefix reuse leaves of re-sent prompts, takes [K x 1]). Few shapes: on
    XLA:CPU every compiled kernel holds three memory mappings, and a process may hold only 65,530."""
    rows = sorted({1} | {min(int(k), max_batch) for k in row_buckets if 0 < int(k) <= budget})
    return {k: tuple(sorted({budget // k, 1}, reverse=True)) for k in rows} if budget > 0 else {}


def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh (axis "tp") over `devices`, by default every device of the runtime: all processes' devices
    when several processes joined it (`cluster.join_cluster`), process by process in order."""
    devs = np.array(list(devices) if devices is not None else jax.devices())
    return Mesh(devs, ("tp",))


def mesh_platform(mesh: Mesh) -> str:
    """The platform of the mesh's devices ("cpu", "gpu", "tpu"), or "mixed" when they differ."""
    platforms = {d.platform for d in mesh.devices.flat}
    return platforms.pop() if len(platforms) == 1 else "mixed"


PREFILL_BATCH_TOKENS = 256  # the most tokens (rows x length bucket) one batched prefill program runs
# warm-up also runs once each program of at most this many tokens: on XLA:CPU a program's first run costs
# ~0.2-0.3 s more than the next ones (the default model; compiled or loaded alike), a whole decode step
PRIME_TOKENS = 64

def with_rows(state: DecodeState, cache_k, cache_v, counts, prompt_mask, row) -> DecodeState:
    """`state` with the new cache and rows row.. of its counts and prompt masks replaced by `counts` and
    `prompt_mask` (each [k, V])."""
    return DecodeState(
        cache_k,
        cache_v,
        jax.lax.dynamic_update_slice_in_dim(state.counts, counts, row, axis=0),
        jax.lax.dynamic_update_slice_in_dim(state.prompt_mask, prompt_mask, row, axis=0),
    )


HEAD_VD = "head_vd"  # the runner's extra params entry: the lm head stored vocab-major, for batched decode


def split_vocab_major_head(params) -> tuple[Any, jax.Array | None]:
    """(the model's params, the runner's vocab-major head copy or None)."""
    if isinstance(params, dict) and HEAD_VD in params:
        return {k: v for k, v in params.items() if k != HEAD_VD}, params[HEAD_VD]
    return params, None


def decode_step(params, state: DecodeState, tokens, positions, bitmask, sampling: SamplingArrays, *,
                forward: Callable, valid_vocab: int, max_batch: int,
                span: int | None = None) -> tuple[DecodeState, SampleOut]:
    """One decode step for rows 0..B-1 as one XLA program: forward one token per row, then unpack the
    grammar bitmask int32[B, ceil(V/32)] and mask, penalise, scale, truncate and sample per row (random
    draws keyed by each row's seed and step). `span` (static): every position is below it, so attention
    reads only that prefix of the cache. Pure; `StepRunner` jits it with the cache donated."""
    b = tokens.shape[0]
    full = b == max_batch
    params, head_vd = split_vocab_major_head(params)
    extra = {} if span is None else {"attend_len": span}
    if head_vd is not None and b > 1:
        extra["head_vd"] = head_vd
    # The forward writes and reads cache rows 0..b-1 in place (row_offset): no copy of the rows in and out.
    logits, ck, cv = forward(params, tokens[:, None], positions[:, None], state.cache_k, state.cache_v, row_offset=0,
                             **extra)
    counts = state.counts if full else state.counts[:b]
    pmask = state.prompt_mask if full else state.prompt_mask[:b]
    out = sample(logits[:, -1], bitmask, counts, pmask, sampling, valid_vocab)
    counts = counts.at[jnp.arange(b), out.tokens].add((positions >= 0).astype(jnp.int32))
    if not full:
        counts = jax.lax.dynamic_update_slice_in_dim(state.counts, counts, 0, axis=0)
    return DecodeState(ck, cv, counts, state.prompt_mask), out


class StepRunner:
    """Owns the device state and the compiled programs for one model, batch size and context length."""

    def __init__(
        self,
        model: StepModel,
        max_batch: int,
        max_context: int,
        vocab_size: int,
        valid_vocab: int,
        mesh: Mesh,
        batch_buckets: Sequence[int],
        length_buckets: Sequence[int],
        span_buckets: Sequence[int] | None = None,
        keep_prefixes: bool = False,
        executables: ExecutableStore | None = None,
        prefill_chunk: int = 0,
        prefill_batches: Sequence[int] = (),
    ) -> None:
        self.vocab_size, self.valid_vocab = vocab_size, valid_vocab
        # reuse idle rows' prefixes (the scheduler's prefix cache): only where the model's cache is positional
        self.keep_prefixes = keep_prefixes and model.prefix_reuse
        self.mask_words = mask_words(vocab_size)
        self.max_batch, self.max_context = max_batch, max_context
        self.batch_buckets, self.length_buckets = tuple(batch_buckets), tuple(length_buckets)
        spans = tuple(sorted({min(int(x), self.max_context) for x in (span_buckets or ())} | {self.max_context}))
        if not model.attention_spans:
            spans = (self.max_context,)  # a forward without attend_len always reads the whole cache
        self.span_buckets = spans
        # prompt tokens a mixed step carries beside the decode rows (0: none, prompts take prefill programs)
        self.prefill_chunk = min(int(prefill_chunk), self.max_context) if model.mixed_steps and max_batch > 1 else 0
        # the decode part of a mixed step runs the largest batch bucket (idle rows padded): few programs
        self.mixed_buckets = (self.batch_buckets[-1],) if self.prefill_chunk else ()
        self.mixed_shapes = mixed_shapes(self.prefill_chunk, prefill_batches, max_batch)
        # several arrivals' prompts in one program: row buckets, each with the length buckets its token budget allows
        batches = sorted({min(int(k), max_batch) for k in prefill_batches} - {0, 1}) if model.mixed_steps else []
        self.prefill_lengths = {kb: lengths for kb in batches if (lengths := tuple(
            t for t in self.length_buckets if kb * t <= PREFILL_BATCH_TOKENS))}
        self.prefill_batches = tuple(self.prefill_lengths)
        self.mesh = mesh
        self.layout = model.layout
        self.executables = executables
        self._compiled: dict[tuple, Any] = {}  # program key -> its executable, from warmup()
        rep = NamedSharding(mesh, P())
        params = model.params
        cache_k, cache_v = model.new_cache(self.max_batch, self.max_context, self.span_buckets)
        # the batch and kv-head axes of every cache array: stacked [L, B, S, KV, D], unrolled chunks [B, KV, ., .]
        self._cache_axis, kv_axis = (0, 1) if model.layout == "unrolled" else (1, 3)
        n_dev = mesh.devices.size

        def cache_sharding(x) -> NamedSharding:  # kv heads over "tp" when they divide over the devices
            if x.shape[kv_axis] % n_dev:
                return rep
            return NamedSharding(mesh, P(*("tp" if axis == kv_axis else None for axis in range(x.ndim))))

        if model.vocab_major_head is not None and max(batch_buckets) > 1:
            params = {**params, HEAD_VD: model.vocab_major_head(params, mesh)}
        state_sh = DecodeState(jax.tree.map(cache_sharding, cache_k), jax.tree.map(cache_sharding, cache_v), rep, rep)
        param_sh = jax.tree.map(lambda x: x.sharding if isinstance(x, jax.Array) else rep, params)
        self.params = jax.device_put(params, param_sh)
        b, v = self.max_batch, vocab_size
        self.state = jax.device_put(
            DecodeState(cache_k, cache_v, jnp.zeros((b, v), jnp.int32), jnp.zeros((b, v), jnp.bool_)), state_sh
        )
        self._forward = model.forward
        # One decode program per attention span (the whole cache is one span); each is traced per batch bucket.
        self._decodes = {
            span: jax.jit(
                functools.partial(self._decode_impl, span=None if span == self.max_context else span),
                donate_argnums=(1,),
                in_shardings=(param_sh, state_sh, rep, rep, rep, rep),
                out_shardings=(state_sh, rep),
            )
            for span in self.span_buckets
        }
        self._mixeds = {
            span: jax.jit(
                functools.partial(self._mixed_impl, span=None if span == self.max_context else span),
                donate_argnums=(1,),
                in_shardings=(param_sh, state_sh) + (rep,) * 13,
                out_shardings=(state_sh, rep),
            )
            for span in (self.span_buckets if self.prefill_chunk else ())
        }
        self._prefill = jax.jit(
            self._prefill_impl,
            donate_argnums=(1,),
            in_shardings=(param_sh, state_sh, rep, rep, rep, rep, rep, rep, rep, rep, rep),
            out_shardings=(state_sh, rep),
        )
        self._prefill_rows = jax.jit(
            self._prefill_rows_impl,
            donate_argnums=(1,),
            in_shardings=(param_sh, state_sh) + (rep,) * 9,
            out_shardings=(state_sh, rep),
        )
        # row moves copy the cache chunks below an extent bucket: in the unrolled layout of a positional cache
        # (prefix reuse needs one) each layer is a tuple of chunks ending at the spans, or empty (a layer that
        # reads another's cache)
        self.move_extents = spans if model.layout == "unrolled" and model.prefix_reuse else (self.max_context,)
        if len(self.move_extents) > 1:
            assert all(len(layer) in (0, len(spans)) for layer in (*cache_k, *cache_v)), "chunks must end at the spans"
        self._moves, self._read_rows, self._write_rows = {}, {}, {}
        for extent in self.move_extents:
            layout = {"cache_axis": self._cache_axis,
                      "chunks": None if extent == self.max_context else spans.index(extent) + 1}
            self._moves[extent] = jax.jit(functools.partial(row_moves.move_row, **layout), donate_argnums=(0,),
                                          in_shardings=(state_sh, rep, rep), out_shardings=state_sh)
            row_sh = DecodeState(row_moves.leading_chunks(state_sh.cache_k, layout["chunks"]),
                                 row_moves.leading_chunks(state_sh.cache_v, layout["chunks"]), rep, rep)
            self._read_rows[extent] = jax.jit(functools.partial(row_moves.read_row, **layout),
                                              in_shardings=(state_sh, rep), out_shardings=row_sh)
            self._write_rows[extent] = jax.jit(functools.partial(row_moves.write_row, **layout), donate_argnums=(0,),
                                               in_shardings=(state_sh, row_sh, rep), out_shardings=state_sh)

    # ---- traced programs -------------------------------------------------------------------------
    def _decode_impl(self, params, state: DecodeState, tokens, positions, bitmask, sp: SamplingArrays, span=None):
        return decode_step(params, state, tokens, positions, bitmask, sp, forward=self._forward,
                           valid_vocab=self.valid_vocab, max_batch=self.max_batch, span=span)

    def _mixed_impl(self, params, state: DecodeState, tokens, positions, chunk, chunk_positions, offset, lengths,
                    valid, fresh, pmask, count_from, final, bitmask, sp: SamplingArrays, span=None):
        # One forward over [b decode tokens | K chunks of C] (`attend_cached` splits attention by row), logits at
        # each decode token and each chunk's last; then the counts and prompt masks as decode and prefill keep
        # them: decode rows count their sampled token; a chunk row (reset when `fresh`) its counted tokens and,
        # when the chunk ends its prompt (`final`), its sampled token; rows of the K that are not `valid` keep theirs.
        b, (k, c) = tokens.shape[0], chunk.shape
        params, head_vd = split_vocab_major_head(params)
        extra = {} if span is None else {"attend_len": span}
        if head_vd is not None:
            extra["head_vd"] = head_vd
        ends = b + jnp.arange(k, dtype=jnp.int32) * c + jnp.maximum(lengths, 1) - 1
        index = jnp.concatenate([jnp.arange(b, dtype=jnp.int32), ends])
        logits, ck, cv = self._forward(params, jnp.concatenate([tokens, chunk.reshape(-1)])[None],
                                       jnp.concatenate([positions, chunk_positions.reshape(-1)])[None], state.cache_k,
                                       state.cache_v, row_offset=offset, logits_index=index[None], mixed=(b, k, c),
                                       **extra)
        decoded = state.counts[:b]  # the decode rows' penalties see the counts before this step
        held_counts = jax.lax.dynamic_slice_in_dim(state.counts, offset, k, axis=0)
        held_pmask = jax.lax.dynamic_slice_in_dim(state.prompt_mask, offset, k, axis=0)
        counted = (chunk_positions >= count_from[:, None]) & (jnp.arange(c)[None, :] < lengths[:, None])
        rows = jnp.arange(k)
        row_counts = jnp.where(fresh[:, None], 0, held_counts).at[rows[:, None], chunk].add(counted.astype(jnp.int32))
        row_pmask = jnp.where(fresh[:, None], pmask, held_pmask)
        out = sample(logits[0], bitmask, jnp.concatenate([decoded, row_counts]),
                     jnp.concatenate([state.prompt_mask[:b], row_pmask]), sp, self.valid_vocab)
        decoded = decoded.at[jnp.arange(b), out.tokens[:b]].add((positions >= 0).astype(jnp.int32))
        counts = jax.lax.dynamic_update_slice_in_dim(state.counts, decoded, 0, axis=0)
        row_counts = row_counts.at[rows, out.tokens[b:]].add(final.astype(jnp.int32))
        keep = valid[:, None]
        # the K rows after the decode rows' update: a padding row may be a decoding row (it counted its token)
        held_counts = jax.lax.dynamic_slice_in_dim(counts, offset, k, axis=0)
        return with_rows(state._replace(counts=counts), ck, cv, jnp.where(keep, row_counts, held_counts),
                         jnp.where(keep, row_pmask, held_pmask), offset), out

    def _prefill_impl(self, params, state: DecodeState, slot, tokens, positions, length, pmask, bitmask, sp,
                      count_from, extend):
        # Writes the tokens' K/V straight into row `slot`; logits only at the last token. Tokens at positions
        # >= count_from are outputs (forced text), counted for the penalties; `extend` keeps the row's counts
        # and prompt mask (a running row), else they start from zero and `pmask`.
        params, _ = split_vocab_major_head(params)
        logits, ck, cv = self._forward(params, tokens, positions, state.cache_k, state.cache_v, row_offset=slot,
                                       logits_index=jnp.reshape(length - 1, (1,)))
        last = logits[:, 0]
        row_counts = jax.lax.dynamic_slice_in_dim(state.counts, slot, 1, axis=0)
        pmask = jnp.where(extend, jax.lax.dynamic_slice_in_dim(state.prompt_mask, slot, 1, axis=0), pmask)
        counted = (positions[0] >= count_from) & (jnp.arange(tokens.shape[1]) < length)
        counts = jnp.where(extend, row_counts, 0).at[0, tokens[0]].add(counted.astype(jnp.int32))
        out = sample(last, bitmask, counts, pmask, sp, self.valid_vocab)
        counts = counts.at[0, out.tokens[0]].add(1)
        return with_rows(state, ck, cv, counts, pmask, slot), out

    def _prefill_rows_impl(self, params, state: DecodeState, offset, tokens, positions, lengths, valid, pmask,
                           bitmask, sp, count_from):
        # kb prompts [kb, t] into rows offset..offset+kb-1, logits at each row's last token; rows not `valid`
        # (padding: positions all -1, so no K/V is written) keep their counts and prompt masks.
        params, head_vd = split_vocab_major_head(params)
        extra = {} if head_vd is None else {"head_vd": head_vd}  # several rows' logits: as decode computes them
        kb, t = tokens.shape
        logits, ck, cv = self._forward(params, tokens, positions, state.cache_k, state.cache_v, row_offset=offset,
                                       logits_index=jnp.maximum(lengths - 1, 0), **extra)
        counted = (positions >= count_from[:, None]) & (jnp.arange(t)[None, :] < lengths[:, None])
        rows = jnp.arange(kb)
        counts = jnp.zeros((kb, state.counts.shape[1]), jnp.int32).at[rows[:, None], tokens].add(
            counted.astype(jnp.int32))
        out = sample(logits[:, 0], bitmask, counts, pmask, sp, self.valid_vocab)
        counts = counts.at[rows, out.tokens].add(1)
        keep = valid[:, None]
        counts = jnp.where(keep, counts, jax.lax.dynamic_slice_in_dim(state.counts, offset, kb, axis=0))
        pmask = jnp.where(keep, pmask, jax.lax.dynamic_slice_in_dim(state.prompt_mask, offset, kb, axis=0))
        return with_rows(state, ck, cv, counts, pmask, offset), out

    # ---- host entry points ----------------------------------------------------------------------
    def _decode_call(self, tokens: np.ndarray, positions: np.ndarray, bitmask: np.ndarray, sp: SamplingArrays):
        """(program key, the decode program for these rows, its arguments): the smallest span above every row's
        position."""
        span = bucket_for(int(np.max(positions, initial=0)) + 1, self.span_buckets)
        return ("decode", span, len(tokens)), self._decodes[span], (self.params, self.state, tokens, positions,
                                                                     bitmask, sp)

    def _prefill_call(self, slot: int, prompt: Sequence[int], bitmask: np.ndarray, sp: SamplingArrays,
                      start: int = 0, prompt_len: int | None = None):
        """(program key, the prefill program, its arguments): prompt[start:] at positions start.., padded to its
        length bucket; the prompt mask covers prompt[:prompt_len] (all of it by default), and tokens from
        prompt_len on are counted as outputs (forced text appended to the prompt)."""
        prompt_len = len(prompt) if prompt_len is None else prompt_len
        pmask = self._prompt_mask(prompt[:prompt_len])
        return self._chunk_call(slot, prompt[start:], start, bitmask, sp, pmask, prompt_len, extend=False)

    def _prompt_mask(self, ids: Sequence[int]) -> np.ndarray:
        """bool[1, V]: the vocabulary ids among `ids` (the penalties' prompt mask of one row)."""
        ids = np.asarray(ids, np.int64)
        pmask = np.zeros((1, self.vocab_size), np.bool_)
        pmask[0, ids[(ids >= 0) & (ids < self.vocab_size)]] = True
        return pmask

    def _chunk_call(self, slot: int, tokens: Sequence[int], start: int, bitmask: np.ndarray, sp: SamplingArrays,
                    pmask: np.ndarray, count_from: int, extend: bool):
        n = len(tokens)
        if not 0 < n <= self.length_buckets[-1] or start < 0 or start + n > self.max_context:
            raise ValueError(f"{n} tokens from position {start} do not fit 1..{self.length_buckets[-1]} tokens "
                             f"within the context of {self.max_context}")
        t = bucket_for(n, self.length_buckets)
        padded = np.zeros((1, t), np.int32)
        padded[0, :n] = tokens
        positions = np.full((1, t), -1, np.int32)
        positions[0, :n] = np.arange(start, start + n, dtype=np.int32)
        return ("prefill", t), self._prefill, (self.params, self.state, np.int32(slot), padded, positions,
                                               np.int32(n), pmask, bitmask, sp, np.int32(count_from),
                                               np.bool_(extend))

    def _pack_rows(self, k: int, t: int, placed: Sequence[tuple[int, Sequence[int], int, Sequence[int] | None, int]]):
        """A [k, t] token block for programs that run several rows' prompts: placed[i] = (row r of the k, the
        tokens it runs, their first position, the tokens of its prompt mask or None (kept), count_from).
        Returns (tokens, positions, lengths, valid, prompt masks, count_from); unplaced rows are padding
        (positions -1, not valid)."""
        tokens, positions = np.zeros((k, t), np.int32), np.full((k, t), -1, np.int32)
        lengths, valid, count_from = np.ones(k, np.int32), np.zeros(k, np.bool_), np.zeros(k, np.int32)
        pmask = np.zeros((k, self.vocab_size), np.bool_)
        for r, run, start, prompt, counted_from in placed:
            n = len(run)
            if not 0 < n <= t or not 0 <= r < k or start < 0 or start + n > self.max_context:
                raise ValueError(f"{n} tokens from position {start} into row {r} of [{k} x {t}] do not fit within "
                                 f"the context of {self.max_context}")
            tokens[r, :n] = run
            positions[r, :n] = np.arange(start, start + n, dtype=np.int32)
            lengths[r], valid[r], count_from[r] = n, True, counted_from
            if prompt is not None:
                pmask[r] = self._prompt_mask(prompt)[0]
        return tokens, positions, lengths, valid, pmask, count_from

    def _spread_rows(self, total: int, at: Sequence[int], bitmask: np.ndarray, sp: SamplingArrays):
        """Bitmasks and sampling arrays for a program of `total` rows: row i of the given ones at row at[i]; the
        others sample anything (their outputs are ignored)."""
        masks = np.full((total, self.mask_words), -1, np.int32)
        masks[list(at)] = bitmask[: len(at)]
        sps = SamplingArrays.numpy(total)
        for full, part in zip(sps, sp, strict=True):
            full[list(at)] = part[: len(at)]
        return masks, sps

    def mixed_shape(self, rows: int, longest: int) -> tuple[int, int] | None:
        """(K, C): the smallest chunk part of `mixed_shapes` spanning `rows` cache rows whose chunk length
        covers `longest` tokens (or the longest it has), or None when no K spans them."""
        for k, lengths in self.mixed_shapes.items():
            if rows <= k:
                return k, next((c for c in reversed(lengths) if longest <= c), lengths[0])
        return None

    def _mixed_call(self, tokens: np.ndarray, positions: np.ndarray,
                    rows: Sequence[tuple[int, Sequence[int], int, Sequence[int] | None, int, bool]],
                    bitmask: np.ndarray, sp: SamplingArrays, shape: tuple[int, int] | None = None):
        slots = [row[0] for row in rows]
        lo, hi = min(slots, default=0), max(slots, default=-1)
        shape = shape or self.mixed_shape(hi - lo + 1, max((len(row[1]) for row in rows), default=0))
        if (not rows or shape is None or shape[0] not in self.mixed_shapes or shape[1] not in self.mixed_shapes[shape[0]]
                or len(set(slots)) != len(slots) or lo < 0 or hi >= self.max_batch):
            raise ValueError(f"chunks into rows {slots} fit no mixed step shape ({self.mixed_shapes})")
        k, c = shape
        offset = min(lo, self.max_batch - k)  # the chunk part's first row: its rows stay inside the cache
        b = len(tokens)
        padded, chunk_positions, lengths, valid, pmask, count_from = self._pack_rows(
            k, c, [(slot - offset, chunk, start, prompt, counted_from)
                   for slot, chunk, start, prompt, counted_from, _ in rows])
        fresh, final = np.zeros(k, np.bool_), np.zeros(k, np.bool_)
        for slot, _, _, prompt, _, ends in rows:
            fresh[slot - offset], final[slot - offset] = prompt is not None, ends
        order = [b + slot - offset for slot in slots]
        masks, sps = self._spread_rows(b + k, [*range(b), *order], bitmask, sp)
        span = bucket_for(max(int(np.max(positions, initial=0)), int(chunk_positions.max())) + 1, self.span_buckets)
        return ("mixed", span, b, k, c), self._mixeds[span], (
            self.params, self.state, tokens, positions, padded, chunk_positions, np.int32(offset), lengths, valid,
            fresh, pmask, count_from, final, masks, sps), np.array([*range(b), *order])

    def rows_bucket(self, count: int, longest: int) -> tuple[int, int] | None:
        """(kb, t): the batched prefill program for `count` prompts whose longest run is `longest` tokens, or
        None when none fits (too many rows or tokens, or batched prefills are off)."""
        for kb, lengths in self.prefill_lengths.items():
            if count <= kb:
                t = next((t for t in lengths if longest <= t), None)
                if t is not None:
                    return kb, t
        return None

    def _rows_call(self, slot: int, rows: Sequence[tuple[Sequence[int], int, int]], bitmask: np.ndarray,
                   sp: SamplingArrays, bucket: tuple[int, int] | None = None):
        k = len(rows)
        longest = max((len(tokens) - start for tokens, start, _ in rows), default=0)
        bucket = bucket or self.rows_bucket(k, longest)
        if bucket is None or k == 0 or not 0 <= slot <= slot + k <= self.max_batch:
            raise ValueError(f"{k} prompts of up to {longest} tokens into rows {slot}.. fit no batched prefill "
                             f"program ({self.prefill_lengths}, {self.max_batch} rows)")
        kb, t = bucket
        offset = min(slot, self.max_batch - kb)  # the program's first row: its rows stay inside the cache
        first = slot - offset
        padded, positions, lengths, valid, pmask, count_from = self._pack_rows(
            kb, t, [(first + i, tokens[start:], start, tokens[:prompt_len], prompt_len)
                    for i, (tokens, start, prompt_len) in enumerate(rows)])
        masks, sps = self._spread_rows(kb, range(first, first + k), bitmask, sp)
        return ("prefill_rows", kb, t), self._prefill_rows, (self.params, self.state, np.int32(offset), padded,
                                                             positions, lengths, valid, pmask, masks, sps,
                                                             count_from), first

    def _run(self, key: tuple, program, args: tuple) -> SampleOut:
        """Run a sampling program (its warmed-up executable when there is one); host numpy outputs."""
        self.state, out = self._compiled.get(key, program)(*args)
        return SampleOut(*(np.asarray(x) for x in out))

    def decode(self, tokens: np.ndarray, positions: np.ndarray, bitmask: np.ndarray, sp: SamplingArrays) -> SampleOut:
        """Run one decode step on slots 0..len(tokens)-1 (a batch bucket); returns host numpy outputs.
        Attention reads the smallest span bucket above every row's position."""
        return self._run(*self._decode_call(tokens, positions, bitmask, sp))

    def prefill(self, slot: int, prompt: Sequence[int], bitmask: np.ndarray, sp: SamplingArrays,
                start: int = 0, prompt_len: int | None = None) -> SampleOut:
        return self._run(*self._prefill_call(slot, prompt, bitmask, sp, start, prompt_len))

    def extend(self, slot: int, tokens: Sequence[int], start: int, bitmask: np.ndarray,
               sp: SamplingArrays) -> SampleOut:
        """Run several tokens into a running row at positions start.. (the last sampled token, then forced text)
        in one step of the prefill program, and sample the next token; the row keeps its prompt mask, and its
        counts gain every token but the first (counted when it was sampled)."""
        pmask = np.zeros((1, self.vocab_size), np.bool_)  # unused: the row keeps its own
        return self._run(*self._chunk_call(slot, tokens, start, bitmask, sp, pmask, start + 1, extend=True))

    def mixed(self, tokens: np.ndarray, positions: np.ndarray,
              rows: Sequence[tuple[int, Sequence[int], int, Sequence[int] | None, int, bool]], bitmask: np.ndarray,
              sp: SamplingArrays, shape: tuple[int, int] | None = None) -> SampleOut:
        """One mixed step: a decode token for each of rows 0..len(tokens)-1 (a `mixed_buckets` bucket; position
        -1: idle, as chunk rows are) and a prompt chunk for each of `rows`: (slot, chunk, start, prompt,
        count_from, final), the chunk's tokens run at positions start..; `prompt` (its first chunk only): the
        row's counts restart and its prompt mask becomes these tokens (else both are kept); chunk tokens at
        positions >= count_from are counted as outputs (forced text); `final`: the chunk ends the prompt, so its
        sampled token is counted. `shape` (K, C) is one of `mixed_shapes` (default: `mixed_shape`'s). bitmask
        and sp have len(tokens) + len(rows) rows; so do the outputs, the decode rows' first."""
        key, program, args, order = self._mixed_call(tokens, positions, rows, bitmask, sp, shape)
        out = self._run(key, program, args)
        return SampleOut(*(x[order] for x in out))

    def prefill_rows(self, slot: int, rows: Sequence[tuple[Sequence[int], int, int]], bitmask: np.ndarray,
                     sp: SamplingArrays) -> SampleOut:
        """Prefill len(rows) prompts into rows slot.. in one program (see `rows_bucket`): rows[i] = (tokens,
        start, prompt_len) as `prefill` takes them; bitmask and sp have one row per prompt. Returns host
        outputs with one row per prompt, in order."""
        key, program, args, first = self._rows_call(slot, rows, bitmask, sp)
        out = self._run(key, program, args)
        return SampleOut(*(x[first:first + len(rows)] for x in out))

    def move(self, src: int, dst: int, extent: int | None = None) -> None:
        """Copy row `src` over row `dst`: the positions below `extent` (None: all) and its counts and prompt mask."""
        e = self._extent_bucket(extent)
        self.state = self._compiled.get(("move", e), self._moves[e])(self.state, np.int32(src), np.int32(dst))

    def swap(self, a: int, b: int, extent: int | None = None) -> None:
        """Trade rows `a` and `b`: the positions below `extent` (None: all), counts and prompt masks."""
        e = self._extent_bucket(extent)
        row = self._compiled.get(("read_row", e), self._read_rows[e])(self.state, np.int32(a))
        self.move(b, a, e)
        self.state = self._compiled.get(("write_row", e), self._write_rows[e])(self.state, row, np.int32(b))

    def _extent_bucket(self, extent: int | None) -> int:
        return self.max_context if extent is None else bucket_for(max(int(extent), 1), self.move_extents)

    def warmup(self, progress: Callable[[int, int], None] | None = None, prime: bool = True) -> None:
        """Compile every bucket ahead of time: each program is lowered and compiled for exactly the arguments
        `decode`/`prefill` pass it (jit then reuses the executable), not run, so warm-up costs compiles only
        (or persistent-cache loads), not a forward over every prompt bucket. `prime`: then run once each
        program of at most `PRIME_TOKENS` tokens (decode buckets, short prefills, small batched prefills,
        the row moves), so no request pays a program's first-run cost; that writes only into the fresh
        cache (no row holds anything yet) and the counts and prompt masks are zeroed after it. Not on a
        multi-process mesh (every process would have to run them in step). `progress(done, total)` is
        called after each program."""
        makers: list[tuple[int, Callable[[], tuple]]] = []  # (tokens, () -> (key, program, args)) per program
        for b in self.batch_buckets:
            sp = SamplingArrays.numpy(b)
            mask = np.zeros((b, self.mask_words), np.int32)
            for span in self.span_buckets:
                positions = np.full(b, -1, np.int32)
                positions[0] = span - 1
                makers.append((b, functools.partial(self._decode_call, np.zeros(b, np.int32), positions, mask, sp)))
        for b in self.mixed_buckets:
            for k, lengths in self.mixed_shapes.items():
                sp, mask = SamplingArrays.numpy(b + 1), np.zeros((b + 1, self.mask_words), np.int32)
                for c in lengths:
                    for span in self.span_buckets:
                        rows = [(0, [0], span - 1, [0], 0, True)]
                        call = functools.partial(self._mixed_call, np.zeros(b, np.int32), np.full(b, -1, np.int32),
                                                 rows, mask, sp, (k, c))
                        makers.append((b + k * c, lambda call=call: call()[:3]))
        sp1, mask1 = SamplingArrays.numpy(1), np.zeros((1, self.mask_words), np.int32)
        for t in self.length_buckets:
            makers.append((t, functools.partial(self._prefill_call, 0, [0] * min(t, self.max_context - 1), mask1,
                                                sp1)))
        for kb, lengths in self.prefill_lengths.items():
            for t in lengths:
                n = min(t, self.max_context - 1)
                rows_call = functools.partial(self._rows_call, 0, [([0] * n, 0, n)] * kb,
                                              np.zeros((kb, self.mask_words), np.int32), SamplingArrays.numpy(kb),
                                              (kb, t))
                makers.append((kb * t, lambda rows_call=rows_call: rows_call()[:3]))
        calls = [make() for _, make in makers]
        for e in self.move_extents:
            calls.append((("move", e), self._moves[e], (self.state, np.int32(0), np.int32(0))))
            if self.keep_prefixes and self.max_batch > 1:
                row = jax.eval_shape(self._read_rows[e], self.state, np.int32(0))
                calls.append((("read_row", e), self._read_rows[e], (self.state, np.int32(0))))
                calls.append((("write_row", e), self._write_rows[e], (self.state, row, np.int32(1))))
        for i, (key, program, args) in enumerate(calls):
            if self.executables is None:
                self._compiled[key] = program.lower(*args).compile()
            else:
                identity = f"{key}|valid_vocab={self.valid_vocab}|layout={self.layout}"
                self._compiled[key] = self.executables.load_or_compile(identity, program, args)
            if progress is not None:
                progress(i + 1, len(calls))
        if prime and jax.process_count() == 1:
            self._prime([make for tokens, make in makers if tokens <= PRIME_TOKENS])

    def _prime(self, makers: Sequence[Callable[[], tuple]]) -> None:
        """Run each program once on the fresh cache (arguments made now: the state is donated by each run),
        then zero the counts and prompt masks it touched."""
        for make in makers:
            self._run(*make())
        for e in self.move_extents:
            if self.keep_prefixes and self.max_batch > 1:
                self.swap(0, 1, e)
            else:
                self.move(0, 0, e)
        fresh = {name: jax.device_put(np.zeros(x.shape, x.dtype), x.sharding)
                 for name, x in (("counts", self.state.counts), ("prompt_mask", self.state.prompt_mask))}
        self.state = jax.block_until_ready(self.state._replace(**fresh))
