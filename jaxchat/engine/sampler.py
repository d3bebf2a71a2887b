"""The masked sampler: pure JAX, traced into the same XLA program as the model's forward.

Contract of `sample(logits, bitmask, counts, prompt_mask, params, valid_vocab)`:
- `logits` f32[B, V]; `bitmask` int32[B, ceil(V/32)] (bit j of word i = token 32*i + j, 1 = allowed; a row
  of all ones (-1 words) is unconstrained); ids >= `valid_vocab` (vocabulary padding) are always disallowed.
- Penalties (per row): repetition (vLLM/HF semantics, over prompt and generated tokens: positive logits
  divided, negative multiplied), presence and frequency (OpenAI semantics, over generated tokens, from
  `counts` int32[B, V]); then temperature, min-p, top-k and top-p, then a categorical draw keyed by
  fold_in(fold_in(key(0), seed), step) per row.  Temperature 0 means greedy (argmax after penalties/mask).
- The returned token is always allowed by the row's mask when the mask allows anything: if the draw lands
  outside it or on a non-finite logit (e.g. NaN logits), the best allowed token is used instead.
- Every parameter is an array, so changing values never recompiles; work that no row needs is skipped
  at run time: one flat `lax.switch` picks greedy, draw, or draw with the top-k/top-p thresholds, and
  `lax.cond`s skip the fallback and the logprobs.
- Argmax over the vocabulary is two-level (`row_argmax`: the max of each block of columns, then the
  argmax inside the winning block), the same as `jnp.argmax` with NaN read as -inf (first maximum; a
  row of only -inf/NaN gives 0), but 10-25x faster on XLA:CPU, whose variadic argmax reduction does not
  vectorise. The random draw is Gumbel-max over the same argmax.
- Logit bias: `bias` (ids i32[B, K], values f32[B, K], K = `jaxchat.engine.types.LOGIT_BIAS_SLOTS`; ids out of range are no
  entry) is added to the logits before everything else (-inf bans a token); the all-empty default costs one
  scatter of K per row.
- Logprobs are of the model's raw distribution (padding excluded): the chosen token's and the top
  `LOGPROB_TOPK`, computed when any row asks for them (zeros otherwise).
- Drafts (speculative decoding): `draft` int32[B] (-1: none) is a proposed token for the row's position. A
  greedy row returns its argmax as always (the draft is accepted when they are equal). A drawing row accepts
  the draft with probability p(draft) under its processed distribution (mask, penalties, temperature,
  min-p, top-k, top-p) and otherwise draws from that distribution with the draft removed: standard
  speculative rejection sampling for a draft that proposes one token with certainty, so the token returned
  follows p exactly. The host accepts drafts while the returned token equals them.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

LOGPROB_TOPK = 20
_HUGE = 3.0e38


class SamplingArrays(NamedTuple):
    """Per-row sampling parameters, each shaped [B]."""

    temperature: jax.Array  # f32
    top_p: jax.Array  # f32
    top_k: jax.Array  # i32, 0 = off
    min_p: jax.Array  # f32
    presence: jax.Array  # f32
    frequency: jax.Array  # f32
    repetition: jax.Array  # f32, 1 = off
    seed: jax.Array  # u32
    step: jax.Array  # i32, tokens generated so far by the row
    logprobs: jax.Array  # bool

    @staticmethod
    def numpy(batch: int) -> SamplingArrays:
        """Neutral (greedy, unpenalised) host-side arrays for `batch` rows."""
        return SamplingArrays(
            temperature=np.zeros(batch, np.float32),
            top_p=np.ones(batch, np.float32),
            top_k=np.zeros(batch, np.int32),
            min_p=np.zeros(batch, np.float32),
            presence=np.zeros(batch, np.float32),
            frequency=np.zeros(batch, np.float32),
            repetition=np.ones(batch, np.float32),
            seed=np.zeros(batch, np.uint32),
            step=np.zeros(batch, np.int32),
            logprobs=np.zeros(batch, np.bool_),
        )


class SampleOut(NamedTuple):
    tokens: jax.Array  # i32[B]
    logprob: jax.Array  # f32[B]
    top_ids: jax.Array  # i32[B, LOGPROB_TOPK]
    top_logprobs: jax.Array  # f32[B, LOGPROB_TOPK]


def unpack_bitmask(bitmask: jax.Array, vocab: int, valid_vocab: int) -> jax.Array:
    """bool[B, vocab]: bit (id % 32) of word (id // 32), and id < valid_vocab."""
    shifts = jnp.arange(32, dtype=jnp.int32)
    bits = (bitmask[:, :, None] >> shifts) & 1
    allowed = bits.reshape(bitmask.shape[0], -1)[:, :vocab].astype(bool)
    return allowed & (jnp.arange(vocab) < valid_vocab)[None, :]


def apply_penalties(x: jax.Array, counts: jax.Array, prompt_mask: jax.Array, p: SamplingArrays) -> jax.Array:
    rep = p.repetition[:, None]
    seen = prompt_mask | (counts > 0)
    x = jnp.where(seen & (rep != 1.0), jnp.where(x > 0, x / rep, x * rep), x)
    return x - p.presence[:, None] * (counts > 0) - p.frequency[:, None] * counts


_BISECT_STEPS = 40


def _block_width(vocab: int) -> int:
    """The widest divisor of `vocab` in 128..2048, or 0 when there is none (then the row is padded)."""
    return next((d for d in range(2048, 127, -1) if vocab % d == 0), 0)


def row_argmax(x: jax.Array) -> jax.Array:
    """int32[B]: `jnp.argmax(x, axis=-1)` for x [B, V], computed per block of columns (see the contract)."""
    b, vocab = x.shape
    x = jnp.where(jnp.isnan(x), -jnp.inf, x)  # XLA's vectorised max does not reliably propagate NaN
    if vocab <= 4096:
        return jnp.argmax(x, axis=-1).astype(jnp.int32)
    width = _block_width(vocab) or 1024
    pad = (-vocab) % width
    if pad:
        x = jnp.pad(x, ((0, 0), (0, pad)), constant_values=-jnp.inf)
    blocks = x.reshape(b, -1, width)
    best_block = jnp.argmax(jnp.max(blocks, axis=-1), axis=-1)
    inside = jnp.take_along_axis(blocks, best_block[:, None, None], axis=1)[:, 0]
    return (best_block * width + jnp.argmax(inside, axis=-1)).astype(jnp.int32)


def _bisect_threshold(values: jax.Array, enough) -> jax.Array:
    """Per row, the largest threshold t with `enough(values >= t, values)` (values [B, V] finite; `enough`
    is monotone: true for t = the row minimum). Bisection: O(steps * V) per row, no sort of the vocabulary.
    `enough` gets `values` as an argument rather than closing over [B, V] arrays: a loop that captures a
    large array made XLA:CPU slow down the whole program by milliseconds even when the branch is skipped."""
    lo = jnp.min(values, axis=-1)
    hi = jnp.max(values, axis=-1)

    def body(_, bounds):
        lo, hi = bounds
        mid = (lo + hi) / 2
        ok = enough(values >= mid[:, None], values)
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    lo, hi = jax.lax.fori_loop(0, _BISECT_STEPS, body, (lo, hi))
    return jnp.where(enough(values >= hi[:, None], values), hi, lo)


def _truncate(y: jax.Array, p: SamplingArrays) -> jax.Array:
    """Top-k then top-p on temperature-scaled logits y [B, V], without sorting the vocabulary: each cut
    is a threshold found by bisection (the k-th largest logit; the smallest probability whose nucleus
    still holds top_p of the mass), keeping ties at the threshold."""
    vocab = y.shape[-1]
    floor = jnp.min(jnp.where(jnp.isfinite(y), y, _HUGE), axis=-1, keepdims=True) - 1.0
    finite = jnp.where(jnp.isfinite(y), y, floor)  # a floor just below the row, so bisection stays precise
    k = jnp.where(p.top_k > 0, jnp.minimum(p.top_k, vocab), vocab)
    kth = _bisect_threshold(finite, lambda keep, _: jnp.sum(keep, axis=-1) >= k)
    y = jnp.where((p.top_k[:, None] > 0) & (finite < kth[:, None]), -jnp.inf, y)
    probs = jax.nn.softmax(y, axis=-1)
    mass = lambda keep, pr: jnp.sum(jnp.where(keep, pr, 0.0), axis=-1) >= p.top_p * (1 - 1e-6)  # noqa: E731
    pth = _bisect_threshold(probs, mass)
    return jnp.where((p.top_p[:, None] < 1.0) & (probs < pth[:, None]), -jnp.inf, y)


def _draw(x: jax.Array, p: SamplingArrays, truncate: bool, draft: jax.Array | None = None) -> jax.Array:
    t = jnp.where(p.temperature > 0, p.temperature, 1.0)[:, None]
    y = x / t
    ymax = jnp.max(y, axis=-1, keepdims=True)
    min_p = p.min_p[:, None]
    y = jnp.where((min_p > 0) & (y < ymax + jnp.log(jnp.maximum(min_p, 1e-30))), -jnp.inf, y)
    if truncate:
        y = _truncate(y, p)
    base = jax.random.key(0)

    def gumbel(seed, step):
        key = jax.random.fold_in(jax.random.fold_in(base, seed), step)
        return jax.random.gumbel(key, y.shape[-1:], jnp.float32)

    noise = jax.vmap(gumbel)(p.seed, p.step)
    if draft is None:
        return row_argmax(y + noise)

    def with_drafts():
        has = draft >= 0
        d = jnp.maximum(draft, 0)
        probs = jax.nn.softmax(y, axis=-1)
        p_draft = jnp.take_along_axis(probs, d[:, None], axis=-1)[:, 0]

        def uniform(seed, step):
            key = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(base, seed), step), 0x5EED)
            return jax.random.uniform(key, (), jnp.float32)

        accept = jax.vmap(uniform)(p.seed, p.step) < p_draft
        removed = jnp.where(has[:, None] & (jnp.arange(y.shape[-1])[None, :] == d[:, None]), -jnp.inf, y)
        residual = row_argmax(removed + noise)
        return jnp.where(has, jnp.where(accept, d, residual), residual)

    return jax.lax.cond(jnp.any(draft >= 0), with_drafts, lambda: row_argmax(y + noise))


def _sampling_path(p: SamplingArrays) -> jax.Array:
    """0: every row greedy; 1: some row draws, none truncates; 2: some drawing row uses top-k/top-p.
    One flat `lax.switch`: a conditional nested in another cost XLA:CPU milliseconds even when skipped."""
    draws = p.temperature > 0
    truncates = draws & ((p.top_k > 0) | (p.top_p < 1.0))
    return jnp.where(jnp.any(truncates), 2, jnp.where(jnp.any(draws), 1, 0))


def _logprobs(logits: jax.Array, tokens: jax.Array, valid_vocab: int):
    vocab = logits.shape[-1]
    lp = jax.nn.log_softmax(jnp.where(jnp.arange(vocab)[None, :] < valid_vocab, logits, -jnp.inf), axis=-1)
    chosen = jnp.take_along_axis(lp, tokens[:, None], axis=-1)[:, 0]
    top_lp, top_ids = jax.lax.top_k(lp, min(LOGPROB_TOPK, vocab))
    return chosen, top_ids.astype(jnp.int32), top_lp


def _no_logprobs(logits: jax.Array, tokens: jax.Array, valid_vocab: int):
    b, k = logits.shape[0], min(LOGPROB_TOPK, logits.shape[-1])
    return jnp.zeros((b,), jnp.float32), jnp.zeros((b, k), jnp.int32), jnp.zeros((b, k), jnp.float32)


def sample(
    logits: jax.Array,
    bitmask: jax.Array | None,
    counts: jax.Array,
    prompt_mask: jax.Array,
    p: SamplingArrays,
    valid_vocab: int,
    draft: jax.Array | None = None,
    bias: tuple[jax.Array, jax.Array] | None = None,
) -> SampleOut:
    """Sample one token per row; `bitmask=None` skips the grammar mask (padding is still masked); `draft`, `bias`:
    see the module docstring."""
    logits = logits.astype(jnp.float32)
    vocab = logits.shape[-1]
    biased = logits
    if bias is not None:
        ids, values = bias
        rows = jnp.arange(logits.shape[0], dtype=jnp.int32)[:, None]
        biased = logits.at[rows, jnp.where(ids < 0, vocab, ids)].add(values, mode="drop")
    if bitmask is None:
        allowed = jnp.broadcast_to(jnp.arange(vocab)[None, :] < valid_vocab, logits.shape)
    else:
        allowed = unpack_bitmask(bitmask, vocab, valid_vocab)
    x = jnp.where(allowed, apply_penalties(biased, counts, prompt_mask, p), -jnp.inf)
    greedy = row_argmax(x)
    tokens = jax.lax.switch(_sampling_path(p), [
        lambda: greedy,
        lambda: jnp.where(p.temperature > 0, _draw(x, p, truncate=False, draft=draft), greedy),
        lambda: jnp.where(p.temperature > 0, _draw(x, p, truncate=True, draft=draft), greedy),
    ])
    # Safety net: a token outside the mask or on a non-finite logit falls back to the best allowed token.
    picked = jnp.take_along_axis(x, tokens[:, None], axis=-1)[:, 0]
    ok = jnp.take_along_axis(allowed, tokens[:, None], axis=-1)[:, 0] & jnp.isfinite(picked)

    def fallback():
        safe = jnp.where(allowed, jnp.nan_to_num(x, nan=-_HUGE, posinf=_HUGE, neginf=-_HUGE), -jnp.inf)
        return jnp.where(ok, tokens, row_argmax(safe))

    tokens = jax.lax.cond(jnp.all(ok), lambda: tokens, fallback)
    chosen, top_ids, top_lp = jax.lax.cond(
        jnp.any(p.logprobs),
        lambda: _logprobs(logits, tokens, valid_vocab),
        lambda: _no_logprobs(logits, tokens, valid_vocab),
    )
    return SampleOut(tokens, chosen, top_ids, top_lp)
