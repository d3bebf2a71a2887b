"""The model configuration: the supported families, `ModelConfig`, `ModelLoadError`, and HF `config.json`
dicts (transformers 4.x and 5.x layouts). A leaf module: it imports nothing from `jaxchat`.

Contract:
- `FAMILIES` is the one list of supported families (HF `model_type`s); the family "x" is implemented
  by the module `jaxchat.models.x` (see `families.family_module`).
- `ModelConfig` is a frozen, hashable description of one decoder-only family (hashable so that it can
  be a static jit argument); an unsupported family or heads that do not group raise `ModelLoadError`,
  the error of a checkpoint that cannot be loaded (its message names the offending tensor, field or file).
- `from_hf_config(d)` reads `model_type` (one of `FAMILIES`; "gemma3", "qwen3_5" or "qwen3_5_moe" with a
  `text_config`; "qwen3_5_moe_text" for the family "qwen3_5_moe"), the
  rope fields in either the 4.x form (`rope_theta`, `rope_scaling`, `rope_local_base_freq`) or the
  5.x form (`rope_parameters`, per layer type for gemma3). A missing required field or an unsupported
  rope type raises `ModelLoadError` naming it. `to_hf_config(cfg)` writes a 4.x-style dict that
  `from_hf_config` reads back to an equal config. `ModelConfig.from_hf_config` / `.to_hf_config()`
  are the same functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

FAMILIES = ("llama", "qwen2", "qwen3", "gemma3_text", "qwen3_next", "qwen3_5_text", "qwen3_5_moe")
HYBRIDS = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe")  # Gated DeltaNet + gated attention (`jaxchat.models.qwen3_next`)
WRAPPERS = {"gemma3": "gemma3_text", "qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe"}  # with a text_config
TEXT_TYPES = {"qwen3_5_moe_text": "qwen3_5_moe"}  # HF text-config model_type -> family  # HF model_type; the family "x" lives in jaxchat.models.x


class ModelLoadError(ValueError):
    """A checkpoint cannot be loaded: the message names the offending tensor, field or file."""


@dataclass(frozen=True)
class ModelConfig:
    family: str  # one of FAMILIES
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # {"rope_type": "llama3"|"linear", "factor": ..., ...} (global layers)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projection biases (qwen2)
    qk_norm: bool = False  # per-head RMSNorm of q and k (qwen3, gemma3)
    hidden_act: str = "silu"  # "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU)
    # gemma3
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None  # per layer: "sliding_attention" | "full_attention"
    rope_local_base_freq: float | None = None  # rope theta of sliding layers
    query_pre_attn_scalar: float | None = None  # attention scale = query_pre_attn_scalar ** -0.5
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    # Gated DeltaNet hybrids (qwen3_next, qwen3_5_text, qwen3_5_moe); layer_types "linear_attention" | "full_attention"
    partial_rotary_factor: float = 1.0  # rope on the first head_dim * factor dims of q and k
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    # routed experts with a shared expert (qwen3_next, qwen3_5_moe)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    # tokens
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default=())

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ModelLoadError(f"family: unsupported model family {self.family!r} (supported: {FAMILIES})")
        if self.num_heads % self.num_kv_heads:
            raise ModelLoadError(f"num_kv_heads: {self.num_kv_heads} does not divide num_heads {self.num_heads}")
        if self.layer_types is not None and len(self.layer_types) != self.num_layers:
            raise ModelLoadError(f"layer_types: {len(self.layer_types)} entries for {self.num_layers} layers")

    def __hash__(self) -> int:  # rope_scaling is a dict: hash its items so the config can be a static jit arg
        items = tuple(sorted(self.rope_scaling.items())) if self.rope_scaling else None
        return hash(tuple(items if f == "rope_scaling" else getattr(self, f) for f in self.__dataclass_fields__))

    @property
    def attn_scale(self) -> float:
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def is_sliding(self) -> tuple[bool, ...]:
        """Per layer: True for a sliding-window layer."""
        if self.sliding_window is None or self.layer_types is None:
            return (self.sliding_window is not None,) * self.num_layers
        return tuple(t == "sliding_attention" for t in self.layer_types)

    def to_hf_config(self) -> dict:
        """A `config.json`-style dict that `from_hf_config` reads back to an equal config."""
        return to_hf_config(self)

    @classmethod
    def from_hf_config(cls, hf: dict) -> ModelConfig:
        return from_hf_config(hf)

    def replace(self, **kw: Any) -> ModelConfig:
        return replace(self, **kw)


SUPPORTED_ROPE = ("default", "llama3", "linear")


def _req(d: dict, key: str):
    if key not in d or d[key] is None:
        raise ModelLoadError(f"config.json: missing required field {key!r}")
    return d[key]


def _rope_scaling(rs: dict | None, where: str) -> dict | None:
    if not rs:
        return None
    rs = {k: v for k, v in rs.items() if k not in ("rope_theta", "partial_rotary_factor", "mrope_section",
                                                   "mrope_interleaved")}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind not in SUPPORTED_ROPE:
        raise ModelLoadError(f"config.json: {where}.rope_type {kind!r} is not supported (supported: {SUPPORTED_ROPE})")
    if kind == "default":
        return None
    rs["rope_type"] = kind
    rs.pop("type", None)
    return rs


def _eos(d: dict) -> tuple[int, ...]:
    eos = d.get("eos_token_id")
    if eos is None:
        return ()
    return tuple(eos) if isinstance(eos, list | tuple) else (int(eos),)


def from_hf_config(d: dict) -> ModelConfig:
    mt = d.get("model_type")
    if mt in WRAPPERS and isinstance(d.get("text_config"), dict):
        mt = WRAPPERS[mt]
        d = {**d["text_config"], "model_type": mt}
    mt = TEXT_TYPES.get(mt, mt)
    if mt not in FAMILIES:
        raise ModelLoadError(f"config.json: model_type {mt!r} is not supported")
    hidden = int(_req(d, "hidden_size"))
    heads = int(_req(d, "num_attention_heads"))
    head_dim = d.get("head_dim") or hidden // heads
    rp = d.get("rope_parameters")
    partial = d.get("partial_rotary_factor")
    if isinstance(rp, dict) and rp.get("partial_rotary_factor") is not None:
        partial = rp["partial_rotary_factor"]
    theta, scaling, local_theta = d.get("rope_theta"), d.get("rope_scaling"), d.get("rope_local_base_freq")
    if isinstance(rp, dict) and rp:
        if "full_attention" in rp or "sliding_attention" in rp:
            full = rp.get("full_attention", {})
            theta = full.get("rope_theta", theta)
            scaling = full
            local_theta = rp.get("sliding_attention", {}).get("rope_theta", local_theta)
        else:
            theta = rp.get("rope_theta", theta)
            scaling = rp
    kw: dict = {
        "family": mt,
        "vocab_size": int(_req(d, "vocab_size")),
        "hidden_size": hidden,
        "intermediate_size": int(_req(d, "moe_intermediate_size" if mt == "qwen3_5_moe" and not d.get(
            "intermediate_size") else "intermediate_size")),
        "num_layers": int(_req(d, "num_hidden_layers")),
        "num_heads": heads,
        "num_kv_heads": int(d.get("num_key_value_heads") or heads),
        "head_dim": int(head_dim),
        "rms_norm_eps": float(d.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(theta if theta is not None else 10000.0),
        "rope_scaling": _rope_scaling(scaling, "rope_scaling"),
        "max_position_embeddings": int(d.get("max_position_embeddings", 4096)),
        "tie_word_embeddings": bool(d.get("tie_word_embeddings", mt == "gemma3_text")),
        "hidden_act": d.get("hidden_act") or d.get("hidden_activation") or "silu",
        "bos_token_id": d.get("bos_token_id"),
        "eos_token_ids": _eos(d),
    }
    if mt == "qwen2":
        kw["attention_bias"] = True
        if d.get("use_sliding_window"):
            raise ModelLoadError("config.json: use_sliding_window=true is not supported for qwen2")
    elif mt == "qwen3":
        kw["qk_norm"] = True
        kw["attention_bias"] = bool(d.get("attention_bias", False))
        if d.get("use_sliding_window"):
            raise ModelLoadError("config.json: use_sliding_window=true is not supported for qwen3")
    elif mt == "llama":
        kw["attention_bias"] = bool(d.get("attention_bias", False))
        if d.get("mlp_bias"):
            raise ModelLoadError("config.json: mlp_bias=true is not supported for llama")
    elif mt in HYBRIDS:
        _hybrid_fields(d, mt, kw, partial)
    else:  # gemma3_text
        kw["qk_norm"] = True
        kw["hidden_act"] = d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh"
        n = kw["num_layers"]
        layer_types = d.get("layer_types")
        if not layer_types:
            pattern = int(d.get("sliding_window_pattern") or d.get("_sliding_window_pattern") or 6)
            layer_types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)]
        kw["layer_types"] = tuple(layer_types)
        kw["sliding_window"] = int(_req(d, "sliding_window"))
        kw["rope_local_base_freq"] = float(local_theta if local_theta is not None else 10000.0)
        kw["query_pre_attn_scalar"] = float(d.get("query_pre_attn_scalar") or kw["head_dim"])
        for k in ("final_logit_softcapping", "attn_logit_softcapping"):
            kw[k] = float(d[k]) if d.get(k) is not None else None
        kw["attention_bias"] = bool(d.get("attention_bias", False))
    return ModelConfig(**kw)


def _hybrid_fields(d: dict, mt: str, kw: dict, partial) -> None:
    """The Gated DeltaNet hybrids' fields (transformers' Qwen3NextConfig / Qwen3_5TextConfig / Qwen3_5MoeTextConfig)."""
    n = kw["num_layers"]
    kw["qk_norm"] = True
    kw["attention_bias"] = bool(d.get("attention_bias", False))
    if kw["attention_bias"]:
        raise ModelLoadError(f"config.json: attention_bias=true is not supported for {mt}")
    kw["partial_rotary_factor"] = float(partial if partial is not None else 0.25)
    layer_types = d.get("layer_types")
    if not layer_types:
        interval = int(d.get("full_attention_interval") or 4)
        layer_types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    bad = sorted({t for t in layer_types if t not in ("linear_attention", "full_attention")})
    if bad:
        raise ModelLoadError(f"config.json: layer_types {bad[0]!r} is not supported for {mt}")
    kw["layer_types"] = tuple(layer_types)
    for k in ("linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads"):
        kw[k] = int(_req(d, k))
    kw["linear_conv_kernel_dim"] = int(d.get("linear_conv_kernel_dim") or 4)
    if kw["linear_num_value_heads"] % kw["linear_num_key_heads"]:
        raise ModelLoadError("config.json: linear_num_key_heads does not divide linear_num_value_heads")
    if mt == "qwen3_5_text":
        return
    kw["num_experts"] = int(_req(d, "num_experts"))
    kw["num_experts_per_tok"] = int(_req(d, "num_experts_per_tok"))
    kw["moe_intermediate_size"] = int(_req(d, "moe_intermediate_size"))
    kw["shared_expert_intermediate_size"] = int(_req(d, "shared_expert_intermediate_size"))
    if mt == "qwen3_next":
        kw["norm_topk_prob"] = bool(d.get("norm_topk_prob", True))
        kw["decoder_sparse_step"] = int(d.get("decoder_sparse_step") or 1)
        kw["mlp_only_layers"] = tuple(int(i) for i in d.get("mlp_only_layers") or ())
    # qwen3_5_moe: every layer routed, top-k always renormalised (the defaults)


def to_hf_config(c: ModelConfig) -> dict:
    d = {
        "model_type": c.family,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_layers,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": c.rope_theta,
        "rope_scaling": c.rope_scaling,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": c.tie_word_embeddings,
        "attention_bias": c.attention_bias,
        "hidden_act": c.hidden_act,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": list(c.eos_token_ids),
    }
    if c.family == "gemma3_text":
        d.update(
            hidden_activation=c.hidden_act,
            sliding_window=c.sliding_window,
            layer_types=list(c.layer_types or ()),
            rope_local_base_freq=c.rope_local_base_freq,
            query_pre_attn_scalar=c.query_pre_attn_scalar,
            final_logit_softcapping=c.final_logit_softcapping,
            attn_logit_softcapping=c.attn_logit_softcapping,
        )
    if c.family in HYBRIDS:
        d.update(partial_rotary_factor=c.partial_rotary_factor, layer_types=list(c.layer_types or ()),
                 linear_conv_kernel_dim=c.linear_conv_kernel_dim, linear_key_head_dim=c.linear_key_head_dim,
                 linear_value_head_dim=c.linear_value_head_dim, linear_num_key_heads=c.linear_num_key_heads,
                 linear_num_value_heads=c.linear_num_value_heads)
        if c.family != "qwen3_5_text":
            d.update(num_experts=c.num_experts, num_experts_per_tok=c.num_experts_per_tok,
                     moe_intermediate_size=c.moe_intermediate_size,
                     shared_expert_intermediate_size=c.shared_expert_intermediate_size,
                     norm_topk_prob=c.norm_topk_prob, decoder_sparse_step=c.decoder_sparse_step,
                     mlp_only_layers=list(c.mlp_only_layers))
    return d
