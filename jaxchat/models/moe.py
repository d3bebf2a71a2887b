"""Routed experts: top-k routing, dispatch of (token, expert) assignments sorted by expert, the per-expert
matmul over only the routed assignments, and the weighted combine back to tokens.

Contract:
- Routing: `softmax_topk(logits, k, normalize)` (Qwen3-MoE, Gemma 4: softmax over all experts, keep the k
  largest, optionally renormalised to sum to 1), `topk_softmax(logits, k)` (gpt-oss: the k largest
  logits, softmax over those k) and `sigmoid_topk(logits, k, bias, normalize, scale)` (LFM2-MoE: sigmoid
  scores, the experts chosen by score + a per-expert bias, weighted by their unbiased scores, optionally
  renormalised, times a scale) all return (weights float32 [N, k], experts int32 [N, k]).
- `dispatch(experts, weights, num_experts)` flattens the N*k assignments and sorts them by expert (stable),
  giving each sorted assignment its token, expert and weight, and the count per expert.
- `expert_matmul(rows, w, d)`: rows [M, in] (the dispatched rows, `gather_rows`) times their own expert's
  matrix of w [E, in, out] -> [M, out]. Only the routed experts are read: with few assignments (decode;
  M <= `SCAN_MAX_ROWS` on CPU) a scan over the sorted assignments multiplies each row by its expert's
  matrix, read in place (no gathered weight copy); otherwise `jax.lax.ragged_dot` over the expert groups
  (the grouped-matmul kernels of TPU and GPU). No path multiplies a token by every expert.
- `expert_matmul` with an int8 `quant.Int8Weight` (scale [E, 1, out]) multiplies by the int8 values converted to
  the rows' dtype (weight-only: activations stay float) and scales each row by its expert's output scales.
- `expert_bias(b, d)` gathers per-assignment biases; `combine(y, d, n)` multiplies each assignment's row by
  its routing weight and sums the rows of each token -> [n, out].
- The expert axis of w is the "experts" logical axis; sharding it over the mesh (expert parallelism)
  changes placement only: the same code runs on one device and many.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxchat.models import quant

SCAN_MAX_ROWS = 256  # above this many assignments the grouped ragged_dot is cheaper than the per-row scan


def softmax_topk(logits, k: int, normalize: bool):
    """Softmax over all experts (float32), the k largest kept, renormalised to sum 1 if `normalize`."""
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, k)
    if normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, experts.astype(jnp.int32)


def topk_softmax(logits, k: int):
    """The k largest logits, softmax over those k (float32)."""
    top, experts = jax.lax.top_k(logits.astype(jnp.float32), k)
    return jax.nn.softmax(top, axis=-1), experts.astype(jnp.int32)


def sigmoid_topk(logits, k: int, bias=None, normalize: bool = True, scale: float = 1.0):
    """Sigmoid scores (float32); the k experts with the largest score + bias (bias [E] or None) keep their
    unbiased scores, renormalised to sum 1 (+1e-6, as LFM2-MoE) if `normalize`, times `scale`."""
    scores = jax.nn.sigmoid(logits.astype(jnp.float32))
    choice = scores if bias is None else scores + bias.astype(jnp.float32)
    _, experts = jax.lax.top_k(choice, k)
    weights = jnp.take_along_axis(scores, experts, axis=-1)
    if normalize:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-6)
    return weights * scale, experts.astype(jnp.int32)


class Dispatch(NamedTuple):
    """The N*k assignments sorted by expert: assignment j is token `token[j]` on expert `expert[j]`."""

    token: jax.Array  # int32 [M]
    expert: jax.Array  # int32 [M], non-decreasing
    weight: jax.Array  # float32 [M]
    group_sizes: jax.Array  # int32 [E], assignments per expert


def dispatch(experts, weights, num_experts: int) -> Dispatch:
    n, k = experts.shape
    flat_expert = experts.reshape(-1)
    order = jnp.argsort(flat_expert, stable=True)
    token = (jnp.arange(n * k, dtype=jnp.int32) // k)[order]
    sizes = jnp.zeros((num_experts,), jnp.int32).at[flat_expert].add(1)
    return Dispatch(token=token, expert=flat_expert[order], weight=weights.reshape(-1)[order], group_sizes=sizes)


def gather_rows(x, d: Dispatch):
    """x [N, in] -> the dispatched rows [M, in]."""
    return jnp.take(x, d.token, axis=0)


def expert_matmul(rows, w, d: Dispatch):
    """rows [M, in] @ w[expert of each row] ([E, in, out]) -> [M, out], reading only routed experts."""
    m = rows.shape[0]
    if quant.is_quantized(w):  # int8 weights: the matmul on the values, scaled per (expert, output) after
        y = expert_matmul(rows, w.values, d)
        return (y.astype(jnp.float32) * jnp.take(w.scale[:, 0], d.expert, axis=0)).astype(rows.dtype)
    if m <= SCAN_MAX_ROWS and jax.default_backend() == "cpu":
        def one(_, pair):
            row, e = pair
            return None, jnp.dot(row, w[e].astype(rows.dtype), preferred_element_type=jnp.float32).astype(rows.dtype)

        return jax.lax.scan(one, None, (rows, d.expert))[1]
    return jax.lax.ragged_dot(rows, w.astype(rows.dtype), d.group_sizes)


def expert_bias(b, d: Dispatch):
    """Per-expert biases b [E, out] -> the bias of each dispatched row [M, out]."""
    return jnp.take(b, d.expert, axis=0)


def combine(y, d: Dispatch, n_tokens: int):
    """Weighted sum of the dispatched rows y [M, out] back to their tokens -> [n_tokens, out]."""
    weighted = y.astype(jnp.float32) * d.weight[:, None]
    return jax.ops.segment_sum(weighted, d.token, num_segments=n_tokens).astype(y.dtype)
