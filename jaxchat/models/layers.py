"""Shared building blocks: RMSNorm, rotary embeddings, GQA attention over the KV cache, gated MLPs,
and the decoder stack that scans the stacked layers.

Contract:
- Every parameter is an `nnx.Param` carrying `axes`, its logical axis names ("embed", "heads",
  "kv_heads", "qkv", "head_dim", "mlp", "gate_up", "vocab", "norm"); stacked layer params get a leading
  "layers" axis. Projection weights keep heads explicit: qkv [embed, kv_heads, groups + 2, head_dim]
  (per kv head its query heads, key, value), o [heads, head_dim, embed]; the MLP keeps HF's [out, in]
  layout, its gate and up projections fused as gate_up [2, mlp, embed] (gate at 0, up at 1) and down
  [embed, mlp], applied to feature-major activations; the token embedding is
  stored transposed, embed [embed, vocab] (also the tied lm head).
- Weights a matmul contracts are declared with `param(..., contract=axes)` and multiplied through
  `quant.qeinsum` (lookups through `quant.take`): plain `jnp.einsum` for float weights, W8A8 when
  `quantize.quantize_params` made them `quant.Int8Weight`s (the same forms).
- Norms compute in float32 and cast back; `RMSNorm(gemma=True)` scales by (1 + w).
- Rotary embeddings use the half-split (rotate_half) layout of HF checkpoints; `rope_inv_freq`
  implements the default, "linear", Llama 3 ("llama3"), YaRN ("yarn") and Gemma 4 "proportional"
  (partial rotary, the unrotated pairs get frequency 0) frequency schedules; `rope_attention_factor` is
  the factor YaRN multiplies cos and sin by (1 for the others).
- Attention optionally adds q/k/v biases (`attention_bias`), an o bias (`o_bias`) and, with
  `attention_sinks`, a learned per-head logit (param `sinks`, axis "heads") that joins the softmax
  denominator only (gpt-oss): probs = exp(s) / (sum exp(s) + exp(sink)).
- Attention writes the new k/v into its layer of the cache (scatter; positions < 0 dropped) and
  attends to that layer's cache under a [B, T, S] boolean mask, softmax in float32; with
  `attend_len=S'` (static, larger than every position in the batch) only the first S' cache positions
  are read (`attention_span`: whole chunks of a per-layer chunked cache, which are the only ones written).
  Where a block reads and writes the cache is a `CacheSlot` (stacked-cache layer, row offset, per-layer
  cache or not). `kv_read` reads a cache without writing (a KV-shared layer reads its source layer's);
  `attend` is the attention over those keys and values, given the queries.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxchat.models import quant
from jaxchat.models.config import ModelConfig
from jaxchat.models.quant import qeinsum

NEG = -1e30


class CacheSlot(NamedTuple):
    """Where one layer's attention reads and writes the cache (see `kv_io`)."""

    layer: Any  # index into a stacked cache [L, Bc, S, KV, D] (int or traced int32); None with per_layer
    row_offset: Any  # the B token rows are cache rows row_offset .. row_offset + B - 1 (int or traced int32)
    per_layer: bool  # the cache is this layer's own (`base.layer_cache`): tuples of position chunks
    # a mixed step (static (B, K, C)): the token axis [1, B + K*C] holds B decode tokens, one per cache row
    # 0..B-1, then K chunks of C tokens for cache rows row_offset .. row_offset + K - 1 (`attend_cached`)
    mixed: tuple[int, int, int] | None = None


def param(shape, axes, dtype, init=0.0, contract: tuple[int, ...] | None = None) -> nnx.Param:
    """A parameter with its logical axes; a weight a matmul contracts gives `contract`, the axes it contracts
    (the ones `quant.quantize_weight` reduces; `quantize.quantize_params` quantises only these)."""
    if contract is None:
        return nnx.Param(jnp.full(shape, init, dtype), axes=tuple(axes))
    return nnx.Param(jnp.full(shape, init, dtype), axes=tuple(axes), contract=tuple(contract))


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, eps: float, dtype, gemma: bool = False):
        self.scale = param((dim,), ("norm",), dtype, 0.0 if gemma else 1.0)
        self.eps = eps
        self.gemma = gemma

    def __call__(self, x):
        h = x.astype(jnp.float32)
        h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + self.eps)
        w = self.scale[...].astype(jnp.float32)
        if self.gemma:
            return (h * (1.0 + w)).astype(x.dtype)
        return (h.astype(x.dtype) * self.scale[...]).astype(x.dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> np.ndarray:
    """Inverse frequencies (float32, [head_dim // 2]) for one rope schedule."""
    inv = (1.0 / (np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim))))
    inv = inv.astype(np.float32)
    if not scaling:
        return inv
    kind = scaling.get("rope_type", "default")
    factor = float(scaling.get("factor", 1.0))
    if kind == "proportional":  # Gemma 4: the first partial_rotary_factor of the pairs rotate, the rest do not
        rotated = int(float(scaling.get("partial_rotary_factor", 1.0)) * head_dim // 2)
        inv[rotated:] = 0.0
        return (inv / np.float32(factor)).astype(np.float32)
    if kind == "linear":
        return (inv / np.float32(factor)).astype(np.float32)
    if kind == "llama3":
        lo, hi = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / lo, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    if kind == "yarn":
        return _yarn_inv_freq(head_dim, theta, scaling)
    if kind == "default":
        return inv
    raise ValueError(f"rope_scaling.rope_type {kind!r} is not supported")


def _yarn_inv_freq(head_dim: int, theta: float, scaling: dict) -> np.ndarray:
    """YaRN: per frequency a blend of the original (extrapolated) and the factor-interpolated frequency,
    ramping linearly between the dimensions of beta_fast and beta_slow rotations over the original context."""
    factor = float(scaling["factor"])
    orig = float(scaling["original_max_position_embeddings"])
    beta_fast, beta_slow = float(scaling.get("beta_fast") or 32), float(scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return head_dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    pos_freqs = np.float32(theta) ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim))
    extra, inter = (1.0 / pos_freqs).astype(np.float32), (1.0 / (np.float32(factor) * pos_freqs)).astype(np.float32)
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    keep = (1 - ramp).astype(np.float32)  # 1: the original frequency
    return (inter * (1 - keep) + extra * keep).astype(np.float32)


def rope_attention_factor(scaling: dict | None) -> float:
    """The factor cos and sin are multiplied by: YaRN's attention scaling (given, from mscale/mscale_all_dim,
    or 0.1 ln(factor) + 1), 1.0 for every other schedule."""
    if not scaling or scaling.get("rope_type") != "yarn":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])

    def mscale(m: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

    m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if m and m_all:
        return float(mscale(float(m)) / mscale(float(m_all)))
    return float(mscale())


def rope_tables(positions, inv_freq: np.ndarray, scale: float = 1.0):
    """cos, sin of shape [B, T, head_dim] (float32) for absolute positions (negatives clamped to 0), both
    multiplied by `scale` (`rope_attention_factor`)."""
    pos = jnp.maximum(positions, 0).astype(jnp.float32)
    freqs = pos[..., None] * jnp.asarray(inv_freq)[None, None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    if scale != 1.0:
        return jnp.cos(emb) * scale, jnp.sin(emb) * scale
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x, cos, sin):
    """x [B, T, N, D]; cos/sin [B, T, D]."""
    half = x.shape[-1] // 2
    xf = x.astype(jnp.float32)
    rot = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    out = xf * cos[:, :, None, :] + rot * sin[:, :, None, :]
    return out.astype(x.dtype)


def attention_span(cache_v, attend_len=None, per_layer: bool = False) -> int:
    """Cache positions attention reads: all of them, or with `attend_len` (every position in the batch is
    below it) the first attend_len, rounded up to whole chunks for a per-layer chunked cache (`per_layer`)."""
    if not per_layer:  # stacked [L, B, S, KV, D]
        return cache_v.shape[2] if attend_len is None else min(cache_v.shape[2], int(attend_len))
    span = 0
    chunks = next((layer for layer in cache_v if layer), ())  # the first layer with a KV cache
    for w in (c.shape[2] for c in chunks):
        if attend_len is not None and span >= attend_len:
            break
        span += w
    return span


def attention_mask(positions, cache_len: int, window: int | None):
    """Boolean [B, T, S]: cache position p is visible to the token at q iff p <= q (and p > q - window)."""
    p = jnp.arange(cache_len, dtype=jnp.int32)[None, None, :]
    q = positions[:, :, None]
    mask = (p <= q) & (q >= 0)
    if window is not None:
        mask = mask & (p > q - window)
    return mask


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype, gemma_norm: bool = False):
        d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # q, k and v are one param grouped by kv head: [d, kv, g + 2, hd] holds, for each kv head, its g
        # query heads, then its key, then its value. One matmul instead of three (the k/v matvecs are tiny
        # and slow on CPU), and sharding "kv_heads" keeps each query group with its key and value.
        self.qkv = param((d, kv, h // kv + 2, hd), ("embed", "kv_heads", "qkv", "head_dim"), dtype, contract=(0,))
        self.o = param((h, hd, d), ("heads", "head_dim", "embed"), dtype, contract=(0, 1))
        if cfg.attention_bias:
            self.qkv_bias = param((kv, h // kv + 2, hd), ("kv_heads", "qkv", "head_dim"), dtype)
        if cfg.o_bias:
            self.o_bias = param((d,), ("embed",), dtype)
        if cfg.attention_sinks:
            self.sinks = param((h,), ("heads",), dtype)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype, gemma=gemma_norm)
            self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype, gemma=gemma_norm)
        self.has_bias = cfg.attention_bias
        self.has_o_bias = cfg.o_bias
        self.has_sinks = cfg.attention_sinks
        self.has_qk_norm = cfg.qk_norm
        self.scale = cfg.attn_scale
        self.softcap = cfg.attn_logit_softcapping
        self.groups = h // kv

    def __call__(self, x, rope, positions, cache, mask, slot: CacheSlot):
        qkv = qeinsum("btd,dkgh->btkgh", x, self.qkv[...])
        if self.has_bias:
            qkv = qkv + self.qkv_bias[...]
        g = self.groups
        q = qkv[:, :, :, :g].reshape(*qkv.shape[:2], -1, qkv.shape[-1])  # heads in HF order
        k, v = qkv[:, :, :, g], qkv[:, :, :, g + 1]
        if self.has_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        sinks = self.sinks[...] if self.has_sinks else None
        cache, out = attend_cached(q, k, v, positions, cache, mask, slot,
                                   lambda *a: attend(*a, self.scale, self.softcap, sinks))
        out = qeinsum("bthk,hkd->btd", out.astype(x.dtype), self.o[...])
        if self.has_o_bias:
            out = out + self.o_bias[...]
        return out, cache


def attend_cached(q, k, v, positions, cache, mask, slot: CacheSlot, attend_fn):
    """Write k/v [B, T, KV, D] into the cache (`kv_io`) and return (cache, attend_fn(q, keys, values, mask)),
    attending over the first mask.shape[-1] cache positions.

    For a mixed step (`slot.mixed` = (B, K, C), every array's token axis [1, B + K*C]) the two parts are
    written and attended separately, decode rows first: the B decode tokens as [B, 1] over cache rows
    0..B-1, then the chunks as [K, C] over rows slot.row_offset.. (which hold no decoding token: their
    decode positions are padding). Only attention is split; every other op of the layer runs on all
    B + K*C tokens at once, so the weights are read once for both."""
    span = mask.shape[-1]
    if slot.mixed is None:
        cache, keys, values = kv_io(cache, k, v, positions, slot, span)
        return cache, attend_fn(q, keys, values, mask)
    b, kc, c = slot.mixed
    outs = []
    for start, rows, cols, part in ((0, b, 1, slot._replace(row_offset=0, mixed=None)),
                                    (b, kc, c, slot._replace(mixed=None))):
        def cut(a, start=start, rows=rows, cols=cols):
            return a[0, start:start + rows * cols].reshape(rows, cols, *a.shape[2:])

        cache, keys, values = kv_io(cache, cut(k), cut(v), cut(positions), part, span)
        out = attend_fn(cut(q), keys, values, cut(mask))
        outs.append(out.reshape(1, rows * cols, *out.shape[2:]))
    return cache, jnp.concatenate(outs, axis=1)


def attend(q, keys, values, mask, scale: float, softcap: float | None = None, sinks=None):
    """Attention of queries q [B, T, H, D] over the position chunks of `kv_io` / `kv_read` (keys
    [B, KV, D, w], values [B, KV, w, D]) under mask [B, T, S]: softmax in float32 -> [B, T, H, D]. With
    `sinks` [H] (gpt-oss) each head's sink logit joins the softmax denominator only."""
    b, t, h, hd = q.shape
    kvh = keys[0].shape[1]
    g = h // kvh
    # queries grouped per kv head: [B, KV, G*T, D]; batched matmuls with (B, KV) as batch dims, one per
    # cache chunk (keys [B, KV, D, w], values [B, KV, w, D]), the scores concatenated along positions
    qg = q.reshape(b, t, kvh, g, hd).transpose(0, 2, 3, 1, 4).reshape(b, kvh, g * t, hd)
    batch = ((0, 1), (0, 1))
    scores = jnp.concatenate([jax.lax.dot_general(qg, kc.astype(q.dtype), (((3,), (2,)), batch),
                                                  preferred_element_type=jnp.float32) for kc in keys],
                             axis=-1) * scale  # [B, KV, G*T, S]
    if softcap is not None:
        scores = jnp.tanh(scores / softcap) * softcap
    scores = scores.reshape(b, kvh, g, t, -1)
    scores = jnp.where(mask[:, None, None, :, :], scores, NEG)
    if sinks is not None:  # exp(s - logaddexp(logsumexp(s), sink))
        lse = jnp.logaddexp(jax.nn.logsumexp(scores, axis=-1, keepdims=True),
                            sinks.astype(jnp.float32).reshape(1, kvh, g, 1, 1))
        probs = jnp.exp(scores - lse)
    else:
        probs = jax.nn.softmax(scores, axis=-1)
    probs = probs.astype(values[0].dtype).reshape(b, kvh, g * t, -1)
    out, start = None, 0
    for vc in values:
        w = vc.shape[2]
        part = jax.lax.dot_general(probs[..., start:start + w], vc, (((3,), (2,)), batch))  # [B, KV, G*T, D]
        out, start = part if out is None else out + part, start + w
    return out.reshape(b, kvh, g, t, hd).transpose(0, 3, 1, 2, 4).reshape(b, t, kvh * g, hd)


def kv_read(cache, slot: CacheSlot, batch: int, span):
    """The keys and values of `kv_io` (lists of position chunks over the first `span` positions, rows
    slot.row_offset .. + batch - 1) read from `cache` without writing to it."""
    ck, cv = cache

    def own_rows(x):
        return x if x.shape[0] == batch else jax.lax.dynamic_slice_in_dim(x, slot.row_offset, batch, axis=0)

    if not slot.per_layer:
        keys, values = own_rows(ck[slot.layer]), own_rows(cv[slot.layer])  # [B, S, KV, D]
        return [keys.transpose(0, 2, 3, 1)[..., :span]], [values.transpose(0, 2, 1, 3)[:, :, :span]]
    keys, values, start = [], [], 0
    for kc, vc in zip(ck, cv, strict=True):
        if start >= span:
            break
        keys.append(own_rows(kc))
        values.append(own_rows(vc))
        start += vc.shape[2]
    return keys, values


def kv_io(cache, k, v, positions, slot: CacheSlot, span):
    """Write the new k/v [B, T, KV, D] into the cache and return (cache, keys, values) of the B rows over
    the first `span` positions: keys a list of [B, KV, D, w] and values of [B, KV, w, D] arrays, one per
    position chunk (their widths add up to span).

    `slot.layer` indexes a stacked cache [L, Bc, S, KV, D]; with `slot.per_layer` the cache is one layer's
    (`base.layer_cache`): tuples of chunks, keys [Bc, KV, D, w] and values [Bc, KV, w, D], of which only
    those starting below span are written and returned (every position is below span). The B token rows
    are the cache rows slot.row_offset .. slot.row_offset + B - 1. Padding positions (< 0) write nothing.
    """
    row_offset = slot.row_offset
    ck, cv = cache
    b, t = positions.shape
    rows = jnp.broadcast_to(jnp.arange(b, dtype=jnp.int32)[:, None] + row_offset, (b, t))
    dtype = (cv[0] if slot.per_layer else cv).dtype
    k, v = k.astype(dtype), v.astype(dtype)

    def own_rows(x):
        return x if x.shape[0] == b else jax.lax.dynamic_slice_in_dim(x, row_offset, b, axis=0)

    if slot.per_layer:
        ck, cv, keys, values, start = list(ck), list(cv), [], [], 0
        for i, w in enumerate(c.shape[2] for c in cv):
            if start >= span:
                break
            # positions outside this chunk (and padding) go out of bounds and are dropped
            cols = jnp.where((positions >= start) & (positions < start + w), positions - start, w)
            ck[i] = ck[i].at[rows, :, :, cols].set(k, mode="drop")  # keys stored transposed
            cv[i] = cv[i].at[rows, :, cols].set(v, mode="drop")
            keys.append(own_rows(ck[i]))
            values.append(own_rows(cv[i]))
            start += w
        return (tuple(ck), tuple(cv)), keys, values
    s = ck.shape[2]
    cols = jnp.where(positions < 0, s, positions)  # padding goes out of bounds and is dropped
    ck = ck.at[slot.layer, rows, cols].set(k, mode="drop")
    cv = cv.at[slot.layer, rows, cols].set(v, mode="drop")
    keys, values = own_rows(ck[slot.layer]), own_rows(cv[slot.layer])  # [B, S, KV, D]
    keys, values = keys.transpose(0, 2, 3, 1)[..., :span], values.transpose(0, 2, 1, 3)[:, :, :span]
    return (ck, cv), [keys], [values]


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype):
        d, f = cfg.hidden_size, cfg.intermediate_size
        # Weights kept [out, in] (HF's own layout), gate and up fused as gate_up [2, f, d], and applied to
        # feature-major activations [d, N]: XLA:CPU's GEMM streams a row-major [out, in] matrix times a thin
        # [in, N] one markedly faster than [N, in] x [in, out] (MLP of 30 SmolLM2-sized layers: -29% at 1
        # row, -17% at 16). The transposes of the thin activations stay separate copies (barriers): folded
        # into the dots they pick the slow kernel again. Int8 weights take the same form: XLA's int8 x int8
        # kernels run it faster than row-major activations too (`bench/int8_ceiling.py`: the int8 step at
        # 16 rows -13%). Sharding "mlp" gives each device matching gate, up and down slices.
        self.gate_up = param((2, f, d), ("gate_up", "mlp", "embed"), dtype, contract=(2,))
        self.down = param((d, f), ("embed", "mlp"), dtype, contract=(1,))
        act = cfg.hidden_act
        if act not in ("silu", "swish", "gelu_pytorch_tanh", "gelu_tanh", "gelu"):
            raise ValueError(f"hidden_act {act!r} is not supported")
        self.gelu = act != "silu" and act != "swish"

    def __call__(self, x):
        lead, d = x.shape[:-1], x.shape[-1]
        xt = jax.lax.optimization_barrier(x.reshape(-1, d).T)  # [d, N]
        h = qeinsum("cfd,dn->cfn", self.gate_up[...], xt)
        g, u = h[0], h[1]
        g = jax.nn.gelu(g, approximate=True) if self.gelu else jax.nn.silu(g)
        out = qeinsum("df,fn->dn", self.down[...], g * u)  # [d, N]
        return jax.lax.optimization_barrier(out).T.reshape(*lead, d)


def make_stack(cfg: ModelConfig, block_cls, dtype):
    """`num_layers` blocks with params stacked on a leading axis (built with nnx.vmap)."""

    @nnx.vmap(in_axes=None, out_axes=0, axis_size=cfg.num_layers)
    def build():
        return block_cls(cfg, dtype)

    return build()


def run_stack(layers, x, positions, cache_k, cache_v, ropes, masks, sliding, row_offset=0, layer_states=None,
              mixed=None):
    """Run the blocks. ropes/masks: (global, local) pairs; sliding: bool per layer.

    With stacked params (`layer_states` None) the blocks are scanned over the stacked cache; with
    `layer_states` (a tuple of per-layer param dicts) the loop is unrolled in Python over the per-layer
    cache (`base.layer_cache`: per layer a tuple of position chunks), so every layer's weights and cache
    are their own buffers (no per-layer dynamic slice, which copies them on CPU).
    """
    graphdef, state = nnx.split(layers)
    n = len(sliding)
    if layer_states is not None:
        blocks = [nnx.merge(graphdef, st) for st in layer_states]
        return run_listed(blocks, x, positions, cache_k, cache_v, ropes, masks, sliding, row_offset, mixed)

    def body(carry, xs):
        h, ck, cv = carry
        st, idx, is_local = xs
        block = nnx.merge(graphdef, st)
        rope = tuple(jnp.where(is_local, a, b) for a, b in zip(ropes[1], ropes[0], strict=True))
        mask = jnp.where(is_local, masks[1], masks[0])
        slot = CacheSlot(layer=idx, row_offset=row_offset, per_layer=False, mixed=mixed)
        h, (ck, cv) = block(h, rope, positions, (ck, cv), mask, slot)
        return (h, ck, cv), None

    xs = (state, jnp.arange(n, dtype=jnp.int32), jnp.asarray(sliding, dtype=bool))
    (x, cache_k, cache_v), _ = jax.lax.scan(body, (x, cache_k, cache_v), xs)
    return x, cache_k, cache_v


def run_listed(blocks, x, positions, cache_k, cache_v, ropes, masks, sliding, row_offset=0, mixed=None):
    """Run a listed family's blocks in order over their per-layer caches (see `run_stack`'s unrolled loop)."""
    cks, cvs = list(cache_k), list(cache_v)
    slot = CacheSlot(layer=None, row_offset=row_offset, per_layer=True, mixed=mixed)
    for i, block in enumerate(blocks):
        j = 1 if sliding[i] else 0
        x, (cks[i], cvs[i]) = block(x, ropes[j], positions, (cks[i], cvs[i]), masks[j], slot)
    return x, tuple(cks), tuple(cvs)


class CausalLM(nnx.Module):
    """Embedding, the layers, final norm and (tied or own) lm head.

    Stacked families (`stacked = True`, every layer a `block_cls`): the stack is scanned over the stacked
    params and cache, or, given `layer_states`, unrolled over per-layer params and caches. Listed families
    (`stacked = False`: layers that differ in shape, e.g. dense and MoE layers, or per-layer head dims) keep
    an `nnx.List` of `block_for(cfg, i, dtype)` and always run unrolled over the per-layer cache, whose
    per-layer shape is `cache_dims(cfg)` (None: the layer keeps no cache of its own). A family whose
    configs may go either way overrides `is_stacked(cfg)` (qwen3_moe: stacked when every layer is sparse)."""

    block_cls: type = None  # set by the family module
    gemma = False
    stacked = True
    mixed_steps = True  # the forward takes `mixed` (every layer's attention goes through `attend_cached`)

    @classmethod
    def is_stacked(cls, cfg: ModelConfig) -> bool:
        """Whether this config's layers are one stack (all alike) or listed."""
        return cls.stacked

    @classmethod
    def block_for(cls, cfg: ModelConfig, i: int, dtype) -> nnx.Module:
        """Layer i's block (listed families)."""
        return cls.block_cls(cfg, dtype)

    @classmethod
    def cache_dims(cls, cfg: ModelConfig) -> tuple[tuple[int, int] | None, ...]:
        """Per layer (num_kv_heads, head_dim) of its own cache, or None where the layer keeps none."""
        return ((cfg.num_kv_heads, cfg.head_dim),) * cfg.num_layers

    def __init__(self, cfg: ModelConfig, dtype):
        self.config = cfg
        # The table is stored [embed, vocab]: as the tied lm head that is a plain [d, V] matmul, which
        # XLA:CPU runs ~25% faster than contracting the minor axis of [V, d]; the lookup gathers columns.
        self.embed = param((cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), dtype, contract=(0,))
        self.stacked = self.is_stacked(cfg)
        if self.stacked:
            self.layers = make_stack(cfg, self.block_cls, dtype)
        else:
            self.layers = nnx.List([self.block_for(cfg, i, dtype) for i in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, gemma=self.gemma)
        if not cfg.tie_word_embeddings:
            self.lm_head = param((cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), dtype, contract=(0,))

    def __call__(self, tokens, positions, cache_k, cache_v, row_offset=0, logits_index=None, layer_states=None,
                 attend_len=None, head_vd=None, mixed=None):
        cfg = self.config
        table = self.embed[...]
        x = jnp.moveaxis(quant.take(table, tokens, axis=1), 0, -1)  # [d, B, T] -> [B, T, d]
        if self.gemma:
            x = x * jnp.asarray(math.sqrt(cfg.hidden_size), table.dtype)
        s = attention_span(cache_v, attend_len, per_layer=layer_states is not None or not self.stacked)
        glob = rope_tables(positions, rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling),
                           rope_attention_factor(cfg.rope_scaling))
        local_theta = cfg.rope_local_base_freq or cfg.rope_theta
        local = rope_tables(positions, rope_inv_freq(cfg.head_dim, local_theta, None)) if self.gemma else glob
        mask_g = attention_mask(positions, s, None)
        mask_l = attention_mask(positions, s, cfg.sliding_window) if cfg.sliding_window else mask_g
        if self.stacked:
            x, cache_k, cache_v = run_stack(self.layers, x, positions, cache_k, cache_v, (glob, local),
                                            (mask_g, mask_l), cfg.is_sliding, row_offset, layer_states, mixed)
        else:
            x, cache_k, cache_v = run_listed(self.layers, x, positions, cache_k, cache_v, (glob, local),
                                             (mask_g, mask_l), cfg.is_sliding, row_offset, mixed)
        if logits_index is not None:
            x = take_logits_positions(x, logits_index)
        x = self.final_norm(x)
        if head_vd is not None:
            logits = vocab_major_logits(x, head_vd)
        elif cfg.tie_word_embeddings:
            logits = qeinsum("btd,dv->btv", x, table, preferred_element_type=jnp.float32)
        else:
            logits = qeinsum("btd,dv->btv", x, self.lm_head[...], preferred_element_type=jnp.float32)
        if cfg.final_logit_softcapping is not None:
            cap = cfg.final_logit_softcapping
            logits = jnp.tanh(logits / cap) * cap
        return logits.astype(jnp.float32), cache_k, cache_v


def take_logits_positions(x, index):
    """x [B, T, d] at the steps whose logits are wanted: index int32[B] gives one step per row, [B, 1, d];
    index int32[B, N] gives N steps per row, [B, N, d] (a mixed step's decode tokens and chunk ends)."""
    idx = index.astype(jnp.int32)
    idx = idx[:, None, None] if idx.ndim == 1 else idx[:, :, None]
    return jnp.take_along_axis(x, idx, axis=1)


def vocab_major_logits(x, head_vd):
    """Logits [B, T, V] from x [B, T, d] and the lm head stored vocab-major, head_vd [V, d].

    Computed as head_vd . x^T -> [V, B*T] and transposed after an optimization barrier: for several rows
    XLA:CPU runs this ~1.5x faster than x . [d, V], but only while the transpose stays a separate copy
    (folded into the dot it picks the slow kernel again)."""
    b, t, d = x.shape
    lt = qeinsum("vd,nd->vn", head_vd, x.reshape(b * t, d), preferred_element_type=jnp.float32)
    return jax.lax.optimization_barrier(lt).T.reshape(b, t, -1)
