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
- Attention hands its roped q and new k/v to the step's attention (`kv.StepAttention`, an engine backend):
  it writes them into the layer's pages of the pool and attends each token over its own row's positions up
  to its own (sliding layers: within the window), softmax in float32. `attend` is that call for one layer;
  the forward (`CausalLM.__call__`) runs over a flat step of T tokens ([1, T, d] activations), and the final
  norm and lm head run only at `logits_index` (the rows' sampled positions).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxchat.models import quant
from jaxchat.models.config import ModelConfig
from jaxchat.models.kv import LayerKV, StepInputs
from jaxchat.models.quant import qeinsum

NEG = -1e30


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

    def __call__(self, x, rope, positions, cache, kv: LayerKV):
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
        cache, out = attend(kv, cache, q, k, v, scale=self.scale, softcap=self.softcap, sinks=sinks)
        out = qeinsum("bthk,hkd->btd", out.astype(x.dtype), self.o[...])
        if self.has_o_bias:
            out = out + self.o_bias[...]
        return out, cache


def attend(kv: LayerKV, cache, q, k, v, *, scale: float, softcap: float | None = None, sinks=None):
    """The step's attention for one layer (`kv.step.attend`): q [1, T, H, D], k/v [1, T, KV, D] (None: read
    only, a KV-shared layer) -> (cache, out [1, T, H, D]); the layer's window and local flag from `kv`."""
    extra = {} if kv.local is None else {"local": kv.local}
    cache, out = kv.step.attend(cache, kv.layer, q[0], None if k is None else k[0], None if v is None else v[0],
                                scale=scale, window=kv.window, softcap=softcap, sinks=sinks, **extra)
    return cache, out[None]


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


def run_stack(layers, x, positions, pools, ropes, kv: LayerKV, sliding, window, layer_states=None):
    """Run the blocks. ropes: (global, local) pairs; sliding: bool per layer; window: the sliding layers' window.

    With stacked params (`layer_states` None) the blocks are scanned over the stacked pool (the layer's index
    into it in `LayerKV.layer`; a stack with both kinds of layers picks the window per layer at run time,
    `LayerKV.local`); with `layer_states` (a tuple of per-layer param dicts) the loop is unrolled in Python
    over per-layer pools, so every layer's weights and pages are their own buffers (no per-layer dynamic
    slice, which copies them on CPU).
    """
    graphdef, state = nnx.split(layers)
    if layer_states is not None:
        blocks = [nnx.merge(graphdef, st) for st in layer_states]
        return run_listed(blocks, x, positions, pools, ropes, kv, sliding, window)
    both = any(sliding) and not all(sliding)

    def body(carry, xs):
        h, pool = carry
        st, idx, is_local = xs
        block = nnx.merge(graphdef, st)
        rope = tuple(jnp.where(is_local, a, b) for a, b in zip(ropes[1], ropes[0], strict=True))
        layer_kv = kv._replace(layer=idx, window=window if any(sliding) else None, local=is_local if both else None)
        h, pool = block(h, rope, positions, pool, layer_kv)
        return (h, pool), None

    xs = (state, jnp.arange(len(sliding), dtype=jnp.int32), jnp.asarray(sliding, dtype=bool))
    (x, pools), _ = jax.lax.scan(body, (x, pools), xs)
    return x, pools


def run_listed(blocks, x, positions, pools, ropes, kv: LayerKV, sliding, window):
    """Run blocks in order over their per-layer pools (see `run_stack`'s unrolled loop)."""
    out = list(pools)
    for i, block in enumerate(blocks):
        j = 1 if sliding[i] else 0
        x, out[i] = block(x, ropes[j], positions, out[i], kv._replace(window=window if sliding[i] else None))
    return x, tuple(out)


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

    def __call__(self, tokens, pools, step: StepInputs, backend, uniform=None, logits_index=None, layer_states=None,
                 head_vd=None):
        cfg = self.config
        table = self.embed[...]
        x = jnp.moveaxis(quant.take(table, tokens[None], axis=1), 0, -1)  # [d, 1, T] -> [1, T, d]
        if self.gemma:
            x = x * jnp.asarray(math.sqrt(cfg.hidden_size), table.dtype)
        positions = step.positions[None]
        glob = rope_tables(positions, rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling),
                           rope_attention_factor(cfg.rope_scaling))
        local_theta = cfg.rope_local_base_freq or cfg.rope_theta
        local = rope_tables(positions, rope_inv_freq(cfg.head_dim, local_theta, None)) if self.gemma else glob
        kv = LayerKV(backend.begin(step, uniform), None, step)
        if self.stacked:
            x, pools = run_stack(self.layers, x, positions, pools, (glob, local), kv, cfg.is_sliding,
                                 cfg.sliding_window, layer_states)
        else:
            x, pools = run_listed(self.layers, x, positions, pools, (glob, local), kv, cfg.is_sliding,
                                  cfg.sliding_window)
        return self.head(x, logits_index, head_vd), pools

    def head(self, x, logits_index, head_vd):
        """Final norm and lm head over x [1, T, d] at `logits_index` [N] (None: every token) -> f32 [N, V]."""
        cfg = self.config
        x = x[0] if logits_index is None else jnp.take(x[0], logits_index, axis=0)
        x = self.final_norm(x)
        if head_vd is not None:
            logits = vocab_major_logits(x, head_vd)
        else:
            head = self.embed[...] if cfg.tie_word_embeddings else self.lm_head[...]
            logits = qeinsum("nd,dv->nv", x, head, preferred_element_type=jnp.float32)
        if cfg.final_logit_softcapping is not None:
            cap = cfg.final_logit_softcapping
            logits = jnp.tanh(logits / cap) * cap
        return logits.astype(jnp.float32)


def vocab_major_logits(x, head_vd):
    """Logits [N, V] from x [N, d] and the lm head stored vocab-major, head_vd [V, d].

    Computed as head_vd . x^T -> [V, N] and transposed after an optimization barrier: for several rows
    XLA:CPU runs this ~1.5x faster than x . [d, V], but only while the transpose stays a separate copy
    (folded into the dot it picks the slow kernel again)."""
    lt = qeinsum("vd,nd->vn", head_vd, x, preferred_element_type=jnp.float32)
    return jax.lax.optimization_barrier(lt).T
