"""Gemma 4 (text decoder) family: layers of different shapes, built as a list (`stacked = False`).

Contract (transformers' `Gemma4ForCausalLM`):
- Embeddings are scaled by sqrt(hidden_size) (the scale cast to the weight dtype first). Norms are RMSNorms
  computed in float32 that multiply by w (not 1 + w); the v norm and the router norm have no weight.
- Attention: q is RMS-normed per head, then roped; k likewise; v is RMS-normed (no weight); the scale is 1.
  Sliding layers use `head_dim`, `num_kv_heads`, a default rope of `rope_local_base_freq` and the window
  (p > q - sliding_window); full layers use `global_head_dim`, `num_global_kv_heads` and their own rope
  (`rope_theta`, e.g. "proportional": partial rotary). With `attention_k_eq_v` a full layer has no v_proj:
  its values are v_norm(k_proj(x)) (k before its norm and rope).
- KV-shared layers (the last `num_kv_shared_layers`) have no k/v projections and no cache of their own:
  they attend over the cache of `cfg.kv_sources[i]` (the last earlier layer of their type), written earlier
  in the same forward; `cache_dims(cfg)` gives None for them.
- Each block: x += post_attn_norm(attn(input_norm(x))); then h = mlp(pre_ffw_norm(x)) (GeGLU; double
  width on KV-shared layers with `double_wide_mlp`); with the MoE block h = post_ffw_norm_1(h) +
  post_ffw_norm_2(experts(pre_ffw_norm_2(x))) routed from x (router: RMS-norm without weight, * scale *
  hidden**-0.5, linear, softmax, top-k renormalised, * per_expert_scale); x += post_ffw_norm(h); then
  with per-layer inputs x += post_per_layer_input_norm(proj(gelu(gate(x)) * per_layer_input[i])); finally
  x *= layer_scalar.
- Per-layer inputs [B, T, L, P]: (norm(reshape(per_layer_model_projection(embeds) * hidden**-0.5)) +
  embed_tokens_per_layer[tokens] * sqrt(P)) * 2**-0.5, embeds being the scaled token embeddings.
- Final norm, tied (or own) lm head, logits soft-capped by `final_logit_softcapping`.
- `hf_entries(cfg)` is the strict HF tensor table: per-layer rows have `layer=None` and paths
  ("layers", "<i>", ...); experts are stored [E, in, out] (HF's gate_up [E, 2I, D] and down [E, D, I]
  transposed) for `moe.expert_matmul`.
- config.json (transformers 5.x `Gemma4TextConfig`): `HF_CONFIG` is Gemma 3's table with Gemma 4's fields;
  `hf_config_read` reads what it cannot say: the full layers' shapes from `per_layer_config` (or, as
  published, `global_head_dim` / `num_global_key_value_heads`), the rope per layer type from
  `rope_parameters`, the last layer forced full, the MoE block's fields when `enable_moe_block`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from jaxchat.models import gemma3_text, moe, quant
from jaxchat.models.config import HF, ModelConfig, ModelLoadError, read_fields, rope_scaling, write_fields
from jaxchat.models.entries import Entry
from jaxchat.models.kv import LayerKV, StepInputs
from jaxchat.models.layers import (
    MLP,
    CausalLM,
    apply_rope,
    attend,
    param,
    rope_inv_freq,
    rope_tables,
)
from jaxchat.models.quant import qeinsum

HF_CONFIG = (
    *gemma3_text.HF_CONFIG,
    HF(None, "attention_bias"),
    HF("rope_theta", default=10000.0),  # these three: from rope_parameters (hf_config_read)
    HF("rope_scaling", default=None),
    HF("rope_local_base_freq", default=10000.0),
    HF("query_pre_attn_scalar", default=1.0),  # Gemma 4 attends with scale 1 (q and k are RMS-normed)
    HF("attn_logit_softcapping", default=None),
    HF("attention_k_eq_v", "attention_k_eq_v", False, bool),
    HF("num_kv_shared_layers", "num_kv_shared_layers", 0, int),
    HF("per_layer_input_size", "hidden_size_per_layer_input", 0, int),
    HF("per_layer_vocab_size", "vocab_size_per_layer_input", conv=int, derive=lambda kw, d: kw["vocab_size"]),
    HF("double_wide_mlp", "use_double_wide_mlp", False, bool),
    HF("enable_moe_block", "enable_moe_block", False, bool),
)
MOE_CONFIG = (  # read and written when enable_moe_block
    HF("num_experts", "num_experts", conv=int),
    HF("num_experts_per_tok", "top_k_experts", conv=int),
    HF("moe_intermediate_size", "moe_intermediate_size", conv=int),
)
LAYER_KEYS = ("head_dim", "num_key_value_heads")  # what per_layer_config may override
DEFAULT_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}


def _full_layer_shape(d: dict, kw: dict) -> None:
    """global_head_dim / num_global_kv_heads from per_layer_config (or the published global_* fields)."""
    types = kw["layer_types"]
    plc = d.get("per_layer_config")
    if plc is None:  # the published form: global_head_dim / num_global_key_value_heads (transformers' defaults)
        g_hd = int(d.get("global_head_dim") or 512)
        g_kv = d.get("num_global_key_value_heads") if kw["attention_k_eq_v"] else None
        plc = {i: {"head_dim": g_hd, **({"num_key_value_heads": g_kv} if g_kv is not None else {})}
               for i, t in enumerate(types) if t == "full_attention"}
    overrides: dict[int, dict] = {}
    for k, v in plc.items():
        if not str(k).isdigit() or not 0 <= int(k) < len(types) or not isinstance(v, dict):
            raise ModelLoadError(f"config.json: per_layer_config key {k!r} is not a layer index")
        bad = [a for a in v if a not in LAYER_KEYS]
        if bad:
            raise ModelLoadError(f"config.json: per_layer_config[{k}].{bad[0]} is not supported")
        overrides[int(k)] = v
    for kind in ("full_attention", "sliding_attention"):
        dims = {(int(overrides.get(i, {}).get("head_dim", kw["head_dim"])),
                 int(overrides.get(i, {}).get("num_key_value_heads") or kw["num_kv_heads"]))
                for i, t in enumerate(types) if t == kind}
        if len(dims) > 1:
            raise ModelLoadError(f"config.json: per_layer_config gives the {kind} layers different shapes {dims}")
        if dims and kind == "full_attention":
            kw["global_head_dim"], kw["num_global_kv_heads"] = dims.pop()
        elif dims and dims.pop() != (kw["head_dim"], kw["num_kv_heads"]):
            raise ModelLoadError("config.json: per_layer_config overrides sliding_attention layers (not supported)")


def hf_config_read(d: dict, kw: dict) -> None:
    if d.get("use_bidirectional_attention") == "all":
        raise ModelLoadError("config.json: use_bidirectional_attention='all' is not supported for gemma4_text")
    kw["layer_types"] = (*kw["layer_types"][:-1], "full_attention")  # transformers forces the last one
    _full_layer_shape(d, kw)
    rp = d.get("rope_parameters") or DEFAULT_ROPE
    if not isinstance(rp, dict) or not ("full_attention" in rp or "sliding_attention" in rp):
        raise ModelLoadError("config.json: rope_parameters must be given per layer type for gemma4_text")
    local = rp.get("sliding_attention") or {}
    if local.get("rope_type", "default") != "default":
        raise ModelLoadError(f"config.json: rope_parameters.sliding_attention.rope_type {local['rope_type']!r} "
                             "is not supported")
    glob = rp.get("full_attention") or {}
    kw["rope_theta"] = float(glob.get("rope_theta", 10000.0))
    kw["rope_scaling"] = rope_scaling(glob, "rope_parameters.full_attention")
    kw["rope_local_base_freq"] = float(local.get("rope_theta", 10000.0))
    if not kw["per_layer_input_size"]:
        kw["per_layer_vocab_size"] = 0
    if kw["enable_moe_block"]:
        read_fields(d, MOE_CONFIG, "gemma4_text", kw)


def hf_config_write(cfg: ModelConfig, d: dict) -> None:
    full = [i for i, s in enumerate(cfg.is_sliding) if not s]
    d.update(
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": cfg.rope_theta,
                                            **(cfg.rope_scaling or {})},
                         "sliding_attention": {"rope_type": "default", "rope_theta": cfg.rope_local_base_freq}},
        per_layer_config={str(i): {"head_dim": cfg.layer_head_dim(i), "num_key_value_heads": cfg.layer_kv_heads(i)}
                          for i in full},
        vocab_size_per_layer_input=cfg.per_layer_vocab_size or cfg.vocab_size)
    if cfg.enable_moe_block:
        d.update(write_fields(cfg, MOE_CONFIG))


class Norm(nnx.Module):
    """Gemma 4's RMSNorm: float32, times w (init 1), or no weight at all (`with_scale=False`)."""

    def __init__(self, dim: int, eps: float, dtype, with_scale: bool = True):
        if with_scale:
            self.scale = param((dim,), ("norm",), dtype, 1.0)
        self.with_scale = with_scale
        self.eps = eps

    def __call__(self, x):
        h = x.astype(jnp.float32)
        h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + self.eps)
        if self.with_scale:
            h = h * self.scale[...].astype(jnp.float32)
        return h.astype(x.dtype)


def _act(cfg: ModelConfig):
    """`hidden_activation` (the MLP's, also the experts' and the per-layer input gate's)."""
    act = cfg.hidden_act
    if act in ("gelu_pytorch_tanh", "gelu_tanh"):
        return lambda x: jax.nn.gelu(x, approximate=True)
    if act == "gelu":
        return lambda x: jax.nn.gelu(x, approximate=False)
    if act in ("silu", "swish"):
        return jax.nn.silu
    raise ModelLoadError(f"config.json: hidden_activation {act!r} is not supported for gemma4_text")


class Gemma4Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, i: int, dtype):
        d, h = cfg.hidden_size, cfg.num_heads
        hd, kv = cfg.layer_head_dim(i), cfg.layer_kv_heads(i)
        self.shared = cfg.kv_sources[i] is not None
        self.k_eq_v = cfg.attention_k_eq_v and not cfg.is_sliding[i]
        own = 0 if self.shared else 1 if self.k_eq_v else 2  # k (and v) rows after the query heads
        # fused as in `layers.Attention`: [d, kv, g + own, hd], per kv head its g query heads, then k, then v
        self.qkv = param((d, kv, h // kv + own, hd), ("embed", "kv_heads", "qkv", "head_dim"), dtype,
                         contract=(0,))
        self.o = param((h, hd, d), ("heads", "head_dim", "embed"), dtype, contract=(0, 1))
        eps = cfg.rms_norm_eps
        self.q_norm = Norm(hd, eps, dtype)
        if not self.shared:
            self.k_norm = Norm(hd, eps, dtype)
            self.v_norm = Norm(hd, eps, dtype, with_scale=False)
        self.groups = h // kv

    def __call__(self, x, rope, positions, cache, kv: LayerKV):
        """`cache` is this layer's own pool, or for a KV-shared layer its source layer's (read, returned as is)."""
        proj = qeinsum("btd,dkgh->btkgh", x, self.qkv[...])
        g = self.groups
        q = self.q_norm(proj[:, :, :, :g].reshape(*proj.shape[:2], -1, proj.shape[-1]))
        cos, sin = rope
        q = apply_rope(q, cos, sin)
        if self.shared:
            k = v = None
        else:
            k = proj[:, :, :, g]
            v = k if self.k_eq_v else proj[:, :, :, g + 1]
            k, v = apply_rope(self.k_norm(k), cos, sin), self.v_norm(v)
        cache, out = attend(kv, cache, q, k, v, scale=1.0)
        return qeinsum("bthk,hkd->btd", out.astype(x.dtype), self.o[...]), cache


class Experts(nnx.Module):
    """Gemma 4's MoE block: router and routed GeGLU experts (only the routed ones computed, `moe`)."""

    def __init__(self, cfg: ModelConfig, dtype):
        d, e, f = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
        self.router_proj = param((d, e), ("embed", "router"), dtype)
        self.router_scale = param((d,), ("norm",), dtype, 1.0)
        self.per_expert_scale = param((e,), ("router",), dtype, 1.0)
        self.gate_up = param((e, d, 2 * f), ("experts", "embed", "expert_gate_up"), dtype, contract=(1,))
        self.down = param((e, f, d), ("experts", "expert_mlp", "embed"), dtype, contract=(1,))
        self.k, self.num_experts, self.eps, self.f = cfg.num_experts_per_tok, e, cfg.rms_norm_eps, f
        self.act = _act(cfg)

    def route(self, x):
        """x [N, d] -> (weights float32 [N, k], experts int32 [N, k])."""
        h = x.astype(jnp.float32)
        h = (h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + self.eps)).astype(x.dtype)
        h = h * self.router_scale[...] * jnp.asarray(x.shape[-1] ** -0.5, x.dtype)
        logits = jnp.dot(h, self.router_proj[...], preferred_element_type=jnp.float32).astype(x.dtype)
        weights, experts = moe.softmax_topk(logits, self.k, normalize=True)
        return weights * self.per_expert_scale[...].astype(jnp.float32)[experts], experts

    def __call__(self, route_x, x):
        """Route on route_x [N, d], run the experts on x [N, d] -> [N, d]."""
        weights, experts = self.route(route_x)
        d = moe.dispatch(experts, weights, self.num_experts)
        h = moe.expert_matmul(moe.gather_rows(x, d), self.gate_up[...], d)  # [M, 2f]
        h = self.act(h[:, :self.f]) * h[:, self.f:]
        return moe.combine(moe.expert_matmul(h, self.down[...], d), d, x.shape[0])


class Gemma4Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, i: int, dtype):
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_norm = Norm(d, eps, dtype)
        self.attn = Gemma4Attention(cfg, i, dtype)
        self.post_attn_norm = Norm(d, eps, dtype)
        self.pre_ffw_norm = Norm(d, eps, dtype)
        wide = cfg.double_wide_mlp and cfg.kv_sources[i] is not None
        self.mlp = MLP(cfg.replace(intermediate_size=cfg.intermediate_size * 2) if wide else cfg, dtype)
        self.post_ffw_norm = Norm(d, eps, dtype)
        self.moe = cfg.enable_moe_block
        if self.moe:
            self.experts = Experts(cfg, dtype)
            self.post_ffw_norm_1 = Norm(d, eps, dtype)
            self.pre_ffw_norm_2 = Norm(d, eps, dtype)
            self.post_ffw_norm_2 = Norm(d, eps, dtype)
        self.pli = cfg.per_layer_input_size
        if self.pli:
            self.pli_gate = param((self.pli, d), ("per_layer", "embed"), dtype, contract=(1,))  # HF [out, in]
            self.pli_proj = param((d, self.pli), ("embed", "per_layer"), dtype, contract=(1,))
            self.post_pli_norm = Norm(d, eps, dtype)
            self.act = _act(cfg)
        self.layer_scalar = param((1,), ("norm",), dtype, 1.0)

    def __call__(self, x, per_layer_input, rope, positions, cache, kv: LayerKV):
        h, cache = self.attn(self.input_norm(x), rope, positions, cache, kv)
        x = x + self.post_attn_norm(h)
        h = self.mlp(self.pre_ffw_norm(x))
        if self.moe:
            flat = x.reshape(-1, x.shape[-1])
            routed = self.experts(flat, self.pre_ffw_norm_2(flat)).reshape(x.shape)
            h = self.post_ffw_norm_1(h) + self.post_ffw_norm_2(routed)
        x = x + self.post_ffw_norm(h)
        if self.pli:
            g = self.act(qeinsum("btd,pd->btp", x, self.pli_gate[...]))
            h = qeinsum("btp,dp->btd", g * per_layer_input, self.pli_proj[...])
            x = x + self.post_pli_norm(h)
        return x * self.layer_scalar[...], cache


class Model(CausalLM):
    """The listed-layers causal LM: its own forward loop (per-layer inputs, KV sharing, two head shapes)."""

    stacked = False

    @classmethod
    def block_for(cls, cfg: ModelConfig, i: int, dtype):
        return Gemma4Block(cfg, i, dtype)

    @classmethod
    def cache_dims(cls, cfg: ModelConfig) -> tuple[tuple[int, int] | None, ...]:
        return tuple(None if src is not None else (cfg.layer_kv_heads(i), cfg.layer_head_dim(i))
                     for i, src in enumerate(cfg.kv_sources))

    def __init__(self, cfg: ModelConfig, dtype):
        super().__init__(cfg, dtype)  # embed, the nnx.List of blocks, lm_head
        d = cfg.hidden_size
        self.final_norm = Norm(d, cfg.rms_norm_eps, dtype)  # w, not 1 + w
        p = cfg.per_layer_input_size
        if p:
            lp = cfg.num_layers * p
            self.embed_per_layer = param((cfg.per_layer_vocab_size, lp), ("vocab", "per_layer"), dtype)
            self.per_layer_model_projection = param((lp, d), ("per_layer", "embed"), dtype, contract=(1,))  # HF [out, in]
            self.per_layer_projection_norm = Norm(p, cfg.rms_norm_eps, dtype)

    def per_layer_inputs(self, tokens, embeds):
        """[B, T, L, P]: the per-layer input of every layer."""
        cfg = self.config
        n, p = cfg.num_layers, cfg.per_layer_input_size
        table = self.embed_per_layer[...]
        ple = jnp.take(table, tokens, axis=0, mode="clip") * jnp.asarray(math.sqrt(p), table.dtype)
        proj = qeinsum("btd,ld->btl", embeds, self.per_layer_model_projection[...])
        proj = proj * jnp.asarray(cfg.hidden_size ** -0.5, proj.dtype)
        proj = self.per_layer_projection_norm(proj.reshape(*proj.shape[:2], n, p))
        return (proj + ple.reshape(*ple.shape[:2], n, p)) * jnp.asarray(2.0 ** -0.5, proj.dtype)

    def __call__(self, tokens, pools, step: StepInputs, backend, uniform=None, logits_index=None, layer_states=None,
                 head_vd=None):
        """Over the per-layer pools (empty for KV-shared layers); see `base.LoadedModel.forward`. `layer_states`
        is not used: a listed model's params hold its layers. With `logits_index` (one position per step row,
        that row's last token), the KV-shared layers, which write nothing, run on those positions only (as
        transformers' `logits_to_keep` slicing does): a one-token step over the same rows' pages."""
        cfg = self.config
        table = self.embed[...]
        x = jnp.moveaxis(quant.take(table, tokens[None], axis=1), 0, -1)  # [d, 1, T] -> [1, T, d]
        x = x * jnp.asarray(math.sqrt(cfg.hidden_size), table.dtype)
        pli = self.per_layer_inputs(tokens[None], x) if cfg.per_layer_input_size else None
        local_hd = cfg.head_dim
        global_hd = cfg.global_head_dim or cfg.head_dim

        def ropes_at(positions):
            return (rope_tables(positions, rope_inv_freq(global_hd, cfg.rope_theta, cfg.rope_scaling)),
                    rope_tables(positions, rope_inv_freq(local_hd, cfg.rope_local_base_freq or cfg.rope_theta, None)))

        positions = step.positions[None]
        ropes = ropes_at(positions)
        kv = LayerKV(backend.begin(step, uniform), None, step)
        out = list(pools)
        for i, block in enumerate(self.layers):
            j = 1 if cfg.is_sliding[i] else 0
            src = cfg.kv_sources[i]
            if src is not None and logits_index is not None:
                step = kept_step(step, logits_index)
                x, pli = jnp.take(x, logits_index, axis=1), None if pli is None else jnp.take(pli, logits_index, axis=1)
                positions = step.positions[None]
                ropes = ropes_at(positions)
                kv = LayerKV(backend.begin(step, (logits_index.shape[0], 1)), None, step)
                logits_index = None
            own = i if src is None else src
            layer_kv = kv._replace(window=cfg.sliding_window if cfg.is_sliding[i] else None)
            x, pool = block(x, None if pli is None else pli[:, :, i], ropes[j], positions, out[own], layer_kv)
            if src is None:
                out[i] = pool
        return self.head(x, logits_index, head_vd), tuple(out)


def kept_step(step: StepInputs, index) -> StepInputs:
    """The step cut to one token per row, the token at index[row] (its last): positions (padding rows: -1),
    one query per row, nothing written."""
    rows = jnp.arange(index.shape[0], dtype=jnp.int32)
    live = rows < step.num_rows[0]
    return step._replace(positions=jnp.where(live, jnp.take(step.positions, index), -1), token_rows=rows,
                         cu_q_lens=jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(live.astype(jnp.int32))]),
                         write_slots=jnp.full(index.shape, -1, jnp.int32))


NORMS = {  # HF name -> param name
    "input_layernorm": "input_norm",
    "post_attention_layernorm": "post_attn_norm",
    "pre_feedforward_layernorm": "pre_ffw_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}
MOE_NORMS = {
    "post_feedforward_layernorm_1": "post_ffw_norm_1",
    "pre_feedforward_layernorm_2": "pre_ffw_norm_2",
    "post_feedforward_layernorm_2": "post_ffw_norm_2",
}


def layer_entries(cfg: ModelConfig, i: int) -> list[Entry]:
    d, h = cfg.hidden_size, cfg.num_heads
    hd, kv = cfg.layer_head_dim(i), cfg.layer_kv_heads(i)
    g = h // kv
    hf, at = f"model.layers.{i}.", ("layers", str(i))

    def e(name, path, shape, conv="id", part=None):
        return Entry(hf + name, (*at, *path), None, shape, conv, part)

    out = [e("self_attn.q_proj.weight", ("attn", "qkv"), (h * hd, d), "in_heads", (2, 0, g)),
           e("self_attn.o_proj.weight", ("attn", "o"), (d, h * hd), "out_heads"),
           e("self_attn.q_norm.weight", ("attn", "q_norm", "scale"), (hd,))]
    if cfg.kv_sources[i] is None:
        out += [e("self_attn.k_proj.weight", ("attn", "qkv"), (kv * hd, d), "in_heads", (2, g, g + 1)),
                e("self_attn.k_norm.weight", ("attn", "k_norm", "scale"), (hd,))]
        if not (cfg.attention_k_eq_v and not cfg.is_sliding[i]):
            out.append(e("self_attn.v_proj.weight", ("attn", "qkv"), (kv * hd, d), "in_heads", (2, g + 1, g + 2)))
    f = cfg.intermediate_size * (2 if cfg.double_wide_mlp and cfg.kv_sources[i] is not None else 1)
    out += [e("mlp.gate_proj.weight", ("mlp", "gate_up"), (f, d), part=(0, 0, 1)),
            e("mlp.up_proj.weight", ("mlp", "gate_up"), (f, d), part=(0, 1, 2)),
            e("mlp.down_proj.weight", ("mlp", "down"), (d, f)),
            e("layer_scalar", ("layer_scalar",), (1,))]
    norms = {**NORMS, **(MOE_NORMS if cfg.enable_moe_block else {})}
    out += [e(f"{name}.weight", (ours, "scale"), (d,)) for name, ours in norms.items()]
    if cfg.enable_moe_block:
        ne, fe = cfg.num_experts, cfg.moe_intermediate_size
        out += [e("router.proj.weight", ("experts", "router_proj"), (ne, d), "t"),
                e("router.scale", ("experts", "router_scale"), (d,)),
                e("router.per_expert_scale", ("experts", "per_expert_scale"), (ne,)),
                e("experts.gate_up_proj", ("experts", "gate_up"), (ne, 2 * fe, d), "experts_t"),
                e("experts.down_proj", ("experts", "down"), (ne, d, fe), "experts_t")]
    if cfg.per_layer_input_size:
        p = cfg.per_layer_input_size
        out += [e("per_layer_input_gate.weight", ("pli_gate",), (p, d)),
                e("per_layer_projection.weight", ("pli_proj",), (d, p)),
                e("post_per_layer_input_norm.weight", ("post_pli_norm", "scale"), (d,))]
    return out


def hf_entries(cfg: ModelConfig) -> list[Entry]:
    d, v = cfg.hidden_size, cfg.vocab_size
    out = [Entry("model.embed_tokens.weight", ("embed",), None, (v, d), "t"),
           Entry("model.norm.weight", ("final_norm", "scale"), None, (d,), "id")]
    if not cfg.tie_word_embeddings:
        out.append(Entry("lm_head.weight", ("lm_head",), None, (v, d), "t"))
    if cfg.per_layer_input_size:
        lp = cfg.num_layers * cfg.per_layer_input_size
        out += [Entry("model.embed_tokens_per_layer.weight", ("embed_per_layer",), None,
                      (cfg.per_layer_vocab_size, lp), "id"),
                Entry("model.per_layer_model_projection.weight", ("per_layer_model_projection",), None, (lp, d), "id"),
                Entry("model.per_layer_projection_norm.weight", ("per_layer_projection_norm", "scale"), None,
                      (cfg.per_layer_input_size,), "id")]
    for i in range(cfg.num_layers):
        out += layer_entries(cfg, i)
    return out
