"""The model configuration: the supported families, `ModelConfig`, `ModelLoadError`, and HF `config.json`
dicts (transformers 4.x and 5.x layouts). A leaf module: it imports nothing from `jaxchat`.

Contract:
- `FAMILIES` is the one list of supported families (HF `model_type`s); the family "x" is implemented
  by the module `jaxchat.models.x` (see `families.family_module`).
- `ModelConfig` is a frozen, hashable description of one decoder-only family (hashable so that it can
  be a static jit argument); an unsupported family or heads that do not group raise `ModelLoadError`,
  the error of a checkpoint that cannot be loaded (its message names the offending tensor, field or file).
- `from_hf_config(d)` reads `model_type` (one of `FAMILIES`; "gemma3", "gemma4", "qwen3_5" or "qwen3_5_moe"
  with a `text_config`; "qwen3_5_moe_text" for the family "qwen3_5_moe"),
  the rope fields (types in `SUPPORTED_ROPE`) in either the 4.x form (`rope_theta`, `rope_scaling`,
  `rope_local_base_freq`) or the 5.x form (`rope_parameters`, per layer type for gemma3 and gemma4). A
  missing required field or an unsupported rope type raises `ModelLoadError` naming it. qwen3_moe reads
  `num_experts` (or 5.x's `num_local_experts`), `num_experts_per_tok`, `moe_intermediate_size`,
  `norm_topk_prob`, `decoder_sparse_step` and `mlp_only_layers`; `ModelConfig.is_sparse` says per layer
  whether its MLP is the routed one. Gemma 4's full-attention layers take their head_dim / kv heads from
  `per_layer_config` (transformers 5.x) or `global_head_dim` / `num_global_key_value_heads` (as
  published); `layer_head_dim(i)`, `layer_kv_heads(i)` and `kv_sources` (the layer whose k/v a KV-shared
  layer reuses) give the per-layer shapes. `to_hf_config(cfg)` writes a 4.x-style dict that
  `from_hf_config` reads back to an equal config. `ModelConfig.from_hf_config` / `.to_hf_config()`
  are the same functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

FAMILIES = ("llama", "qwen2", "qwen3", "gemma3_text", "qwen3_moe", "gpt_oss", "gemma4_text", "lfm2", "lfm2_moe",
            "qwen3_next", "qwen3_5_text", "qwen3_5_moe")  # HF model_type; the family "x" lives in jaxchat.models.x
HYBRIDS = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe")  # Gated DeltaNet + gated attention (`jaxchat.models.qwen3_next`)
WRAPPERS = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "qwen3_5": "qwen3_5_text",
            "qwen3_5_moe": "qwen3_5_moe"}  # with a text_config
TEXT_TYPES = {"qwen3_5_moe_text": "qwen3_5_moe"}  # HF text-config model_type -> family


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
    # attention extras (gpt_oss)
    o_bias: bool = False  # o projection bias
    attention_sinks: bool = False  # a learned per-head logit in the softmax denominator
    # routed experts (qwen3_moe: a layer is sparse unless listed in mlp_only_layers or off decoder_sparse_step;
    # gpt_oss: every layer, each expert's hidden size is `intermediate_size`)
    num_experts: int = 0  # HF num_experts / num_local_experts
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalise the kept top-k routing weights to sum 1
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    swiglu_limit: float | None = None  # gpt_oss clamped SwiGLU: gate <= limit, -limit <= up <= limit
    swiglu_alpha: float = 1.702  # gpt_oss: glu = gate * sigmoid(alpha * gate)
    # gemma4: full-attention ("global") layers may have their own head_dim and kv heads
    global_head_dim: int | None = None  # head_dim of full-attention layers (None: head_dim)
    num_global_kv_heads: int | None = None  # kv heads of full-attention layers (None: num_kv_heads)
    attention_k_eq_v: bool = False  # full-attention layers have no v_proj: values come from the key projection
    num_kv_shared_layers: int = 0  # the last layers reuse the k/v of the last earlier layer of their type
    per_layer_input_size: int = 0  # hidden_size_per_layer_input: per-layer input embeddings (0: none)
    per_layer_vocab_size: int = 0  # vocab_size_per_layer_input
    double_wide_mlp: bool = False  # use_double_wide_mlp: KV-shared layers have a 2x intermediate_size MLP
    enable_moe_block: bool = False  # gemma4: every layer adds a routed-expert block to its dense MLP
    # lfm2, lfm2_moe: layer_types per layer "conv" | "full_attention"; the short convolution's window
    conv_kernel_size: int = 3  # HF conv_L_cache
    conv_bias: bool = False
    routed_scaling_factor: float = 1.0
    use_expert_bias: bool = False
    # routed experts, lfm2_moe
    num_dense_layers: int = 0  # the first layers keep a dense MLP
    # Gated DeltaNet hybrids (qwen3_next, qwen3_5_text, qwen3_5_moe); layer_types "linear_attention" | "full_attention"
    partial_rotary_factor: float = 1.0  # rope on the first head_dim * factor dims of q and k
    linear_conv_kernel_dim: int = 4
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    # the shared expert (qwen3_next, qwen3_5_moe)
    shared_expert_intermediate_size: int = 0
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
        if self.num_experts and not 0 < self.num_experts_per_tok <= self.num_experts:
            raise ModelLoadError(f"num_experts_per_tok: {self.num_experts_per_tok} is not in 1..{self.num_experts}")
        if self.num_global_kv_heads and self.num_heads % self.num_global_kv_heads:
            raise ModelLoadError(f"num_global_key_value_heads: {self.num_global_kv_heads} does not divide "
                                 f"num_heads {self.num_heads}")
        if self.num_kv_shared_layers:
            self.kv_sources  # noqa: B018 (validates the sharing pattern)

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

    @property
    def is_sparse(self) -> tuple[bool, ...]:
        """Per layer: True for a routed-experts (MoE) MLP, as transformers' Qwen3-MoE decides it."""
        step = max(self.decoder_sparse_step, 1)
        return tuple(self.num_experts > 0 and i not in self.mlp_only_layers and (i + 1) % step == 0
                     for i in range(self.num_layers))

    def layer_head_dim(self, i: int) -> int:
        """head_dim of layer i (full-attention layers may have `global_head_dim`)."""
        return self.global_head_dim if self.global_head_dim and not self.is_sliding[i] else self.head_dim

    def layer_kv_heads(self, i: int) -> int:
        """kv heads of layer i (full-attention layers may have `num_global_kv_heads`)."""
        return self.num_global_kv_heads if self.num_global_kv_heads and not self.is_sliding[i] else self.num_kv_heads

    @property
    def kv_sources(self) -> tuple[int | None, ...]:
        """Per layer: None for a layer that computes its own k/v, else the layer whose k/v (cache) it reuses:
        the last layer of the same type before the `num_kv_shared_layers` shared ones."""
        n, shared = self.num_layers, self.num_kv_shared_layers
        first = n - shared
        if shared and first <= 0:
            raise ModelLoadError(f"num_kv_shared_layers: {shared} leaves no layer computing k/v ({n} layers)")
        types = self.layer_types or ("full_attention",) * n
        out: list[int | None] = [None] * first
        for i in range(first, n):
            src = [j for j in range(first) if types[j] == types[i]]
            if not src:
                raise ModelLoadError(f"num_kv_shared_layers: shared layer {i} ({types[i]}) has no earlier "
                                     f"{types[i]} layer to reuse k/v from")
            out.append(src[-1])
        return tuple(out)

    def to_hf_config(self) -> dict:
        """A `config.json`-style dict that `from_hf_config` reads back to an equal config."""
        return to_hf_config(self)

    @classmethod
    def from_hf_config(cls, hf: dict) -> ModelConfig:
        return from_hf_config(hf)

    def replace(self, **kw: Any) -> ModelConfig:
        return replace(self, **kw)


SUPPORTED_ROPE = ("default", "llama3", "linear", "yarn", "proportional")


def _req(d: dict, key: str):
    if key not in d or d[key] is None:
        raise ModelLoadError(f"config.json: missing required field {key!r}")
    return d[key]


def _rope_scaling(rs: dict | None, where: str) -> dict | None:
    if not rs:
        return None
    kind = rs.get("rope_type", rs.get("type", "default"))
    dropped = ("rope_theta", "mrope_section", "mrope_interleaved")  # partial rotary is a field of its own,
    if kind != "proportional":  # except in Gemma 4's proportional rope, which is defined by it
        dropped += ("partial_rotary_factor",)
    rs = {k: v for k, v in rs.items() if k not in dropped}
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
        "intermediate_size": 0 if "block_ff_dim" in d else int(_req(d, "moe_intermediate_size" if mt == "qwen3_5_moe"
                                                                    and not d.get("intermediate_size") else "intermediate_size")),
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
    elif mt == "qwen3_moe":
        kw["qk_norm"] = True
        kw["attention_bias"] = bool(d.get("attention_bias", False))
        if d.get("use_sliding_window"):
            raise ModelLoadError("config.json: use_sliding_window=true is not supported for qwen3_moe")
        experts = d.get("num_experts", d.get("num_local_experts"))  # 5.x writes num_local_experts
        if experts is None:
            raise ModelLoadError("config.json: missing required field 'num_experts'")
        kw["num_experts"] = int(experts)
        kw["num_experts_per_tok"] = int(_req(d, "num_experts_per_tok"))
        kw["moe_intermediate_size"] = int(_req(d, "moe_intermediate_size"))
        kw["norm_topk_prob"] = bool(d.get("norm_topk_prob", False))
        kw["decoder_sparse_step"] = int(d.get("decoder_sparse_step") or 1)
        kw["mlp_only_layers"] = tuple(int(i) for i in d.get("mlp_only_layers") or ())
    elif mt == "llama":
        kw["attention_bias"] = bool(d.get("attention_bias", False))
        if d.get("mlp_bias"):
            raise ModelLoadError("config.json: mlp_bias=true is not supported for llama")
    elif mt == "gpt_oss":
        _gpt_oss(d, kw)
    elif mt in ("lfm2", "lfm2_moe"):
        _lfm2_fields(d, kw, theta)
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
        if mt == "gemma4_text":
            _gemma4(d, kw)
    rs = kw["rope_scaling"]
    if rs and rs["rope_type"] == "yarn":
        if rs.get("original_max_position_embeddings") is None:
            raise ModelLoadError("config.json: rope_scaling.original_max_position_embeddings is required for yarn")
        if rs.get("factor") is None:  # as transformers: the context extension ratio
            rs["factor"] = kw["max_position_embeddings"] / float(rs["original_max_position_embeddings"])
    return ModelConfig(**kw)


def _gpt_oss(d: dict, kw: dict) -> None:
    n = kw["num_layers"]
    kw["attention_bias"] = bool(d.get("attention_bias", True))
    kw["o_bias"] = kw["attention_bias"]
    kw["attention_sinks"] = True
    kw["sliding_window"] = int(_req(d, "sliding_window"))
    layer_types = d.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)]
    kw["layer_types"] = tuple(layer_types)
    kw["num_experts"] = int(_req(d, "num_local_experts"))
    k = d.get("num_experts_per_tok") or d.get("experts_per_token")
    if not k:
        raise ModelLoadError("config.json: missing required field 'num_experts_per_tok'")
    kw["num_experts_per_tok"] = int(k)
    kw["swiglu_limit"] = float(d.get("swiglu_limit", 7.0))
    kw["swiglu_alpha"] = float(d.get("swiglu_alpha", 1.702))
    rp = d.get("rope_parameters") or {}
    if d.get("rope_theta") is None and rp.get("rope_theta") is None:
        kw["rope_theta"] = 150000.0  # transformers' GptOssConfig defaults
    if not d.get("rope_scaling") and not rp:
        kw["rope_scaling"] = dict(GPT_OSS_YARN)


GPT_OSS_YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}


GEMMA4_LAYER_KEYS = ("head_dim", "num_key_value_heads")  # what per_layer_config may override


def _gemma4(d: dict, kw: dict) -> None:
    """The Gemma 4 text fields (transformers 5.x `Gemma4TextConfig`, incl. its `per_layer_config`)."""
    if d.get("use_bidirectional_attention") == "all":
        raise ModelLoadError("config.json: use_bidirectional_attention='all' is not supported for gemma4_text")
    if d.get("attention_bias"):
        raise ModelLoadError("config.json: attention_bias=true is not supported for gemma4_text")
    types = kw["layer_types"] = (*kw["layer_types"][:-1], "full_attention")  # transformers forces the last one
    kw["query_pre_attn_scalar"] = 1.0  # Gemma 4 attends with scale 1 (q and k are RMS-normed)
    kw["attn_logit_softcapping"] = None
    kw["tie_word_embeddings"] = bool(d.get("tie_word_embeddings", True))
    kw["attention_k_eq_v"] = bool(d.get("attention_k_eq_v", False))
    full = [i for i, t in enumerate(types) if t == "full_attention"]
    plc = d.get("per_layer_config")
    if plc is None:  # the published form: global_head_dim / num_global_key_value_heads (transformers' defaults)
        g_hd = int(d.get("global_head_dim") or 512)
        g_kv = d.get("num_global_key_value_heads") if kw["attention_k_eq_v"] else None
        plc = {i: {"head_dim": g_hd, **({"num_key_value_heads": g_kv} if g_kv is not None else {})} for i in full}
    overrides: dict[int, dict] = {}
    for k, v in plc.items():
        if not str(k).isdigit() or not 0 <= int(k) < len(types) or not isinstance(v, dict):
            raise ModelLoadError(f"config.json: per_layer_config key {k!r} is not a layer index")
        bad = [a for a in v if a not in GEMMA4_LAYER_KEYS]
        if bad:
            raise ModelLoadError(f"config.json: per_layer_config[{k}].{bad[0]} is not supported")
        overrides[int(k)] = v
    for kind, base_hd, base_kv in (("full_attention", None, None), ("sliding_attention", kw["head_dim"],
                                                                     kw["num_kv_heads"])):
        layers = [i for i, t in enumerate(types) if t == kind]
        dims = {(int(overrides.get(i, {}).get("head_dim", kw["head_dim"])),
                 int(overrides.get(i, {}).get("num_key_value_heads") or kw["num_kv_heads"])) for i in layers}
        if len(dims) > 1:
            raise ModelLoadError(f"config.json: per_layer_config gives the {kind} layers different shapes {dims}")
        if dims and kind == "full_attention":
            kw["global_head_dim"], kw["num_global_kv_heads"] = dims.pop()
        elif dims and dims.pop() != (base_hd, base_kv):
            raise ModelLoadError("config.json: per_layer_config overrides sliding_attention layers (not supported)")
    rp = d.get("rope_parameters") or {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
    if not isinstance(rp, dict) or not ("full_attention" in rp or "sliding_attention" in rp):
        raise ModelLoadError("config.json: rope_parameters must be given per layer type for gemma4_text")
    local = rp.get("sliding_attention") or {}
    if local.get("rope_type", "default") != "default":
        raise ModelLoadError(f"config.json: rope_parameters.sliding_attention.rope_type {local['rope_type']!r} "
                             "is not supported")
    glob = rp.get("full_attention") or {}
    kw["rope_theta"] = float(glob.get("rope_theta", 10000.0))
    kw["rope_scaling"] = _rope_scaling(glob, "rope_parameters.full_attention")
    kw["rope_local_base_freq"] = float(local.get("rope_theta", 10000.0))
    kw["num_kv_shared_layers"] = int(d.get("num_kv_shared_layers") or 0)
    kw["per_layer_input_size"] = int(d.get("hidden_size_per_layer_input") or 0)
    kw["per_layer_vocab_size"] = int(d.get("vocab_size_per_layer_input") or kw["vocab_size"]) \
        if kw["per_layer_input_size"] else 0
    kw["double_wide_mlp"] = bool(d.get("use_double_wide_mlp", False))
    if d.get("enable_moe_block"):
        kw["enable_moe_block"] = True
        kw["num_experts"] = int(_req(d, "num_experts"))
        kw["num_experts_per_tok"] = int(_req(d, "top_k_experts"))
        kw["moe_intermediate_size"] = int(_req(d, "moe_intermediate_size"))


LFM2_LAYER_TYPES = ("conv", "full_attention")


def _lfm2_fields(d: dict, kw: dict, theta) -> None:
    """lfm2 / lfm2_moe: layer types (or full_attn_idxs), the conv window, norm_eps, the 4.x aliases
    (block_ff_dim, tie_embedding), lfm2's MLP size adjustment, and lfm2_moe's routed experts."""
    mt, n = kw["family"], kw["num_layers"]
    kw["qk_norm"] = True
    kw["rms_norm_eps"] = float(d.get("norm_eps", d.get("rms_norm_eps", 1e-5)))
    kw["rope_theta"] = float(theta if theta is not None else 1000000.0)
    kw["max_position_embeddings"] = int(d.get("max_position_embeddings", 128000))
    kw["tie_word_embeddings"] = bool(d.get("tie_embedding", d.get("tie_word_embeddings", True)))
    kw["hidden_act"] = "silu"
    layer_types = d.get("layer_types")
    if not layer_types:
        idxs = d.get("full_attn_idxs")
        if idxs is None and mt == "lfm2_moe":
            raise ModelLoadError("config.json: missing required field 'layer_types'")
        idxs = range(n) if idxs is None else idxs
        layer_types = ["full_attention" if i in idxs else "conv" for i in range(n)]
    bad = [t for t in layer_types if t not in LFM2_LAYER_TYPES]
    if bad:
        raise ModelLoadError(f"config.json: layer_types entry {bad[0]!r} is not supported (supported: {LFM2_LAYER_TYPES})")
    kw["layer_types"] = tuple(layer_types)
    kw["conv_kernel_size"] = int(d.get("conv_L_cache", 3))
    kw["conv_bias"] = bool(d.get("conv_bias", False))
    ff = d.get("block_ff_dim", d.get("intermediate_size"))
    if ff is None:
        raise ModelLoadError("config.json: missing required field 'intermediate_size'")
    ff = int(ff)
    if mt == "lfm2" and d.get("block_auto_adjust_ff_dim", True):  # the size the MLP really has
        ff = int(2 * ff / 3)
        mult = d.get("block_ffn_dim_multiplier", 1.0)
        if mult is not None:
            ff = int(mult * ff)
            step = int(d.get("block_multiple_of", 256))
            ff = step * ((ff + step - 1) // step)
    kw["intermediate_size"] = ff
    if mt == "lfm2_moe":
        kw["num_experts"] = int(_req(d, "num_experts"))
        kw["num_experts_per_tok"] = int(_req(d, "num_experts_per_tok"))
        kw["moe_intermediate_size"] = int(_req(d, "moe_intermediate_size"))
        kw["norm_topk_prob"] = bool(d.get("norm_topk_prob", True))
        kw["routed_scaling_factor"] = float(d.get("routed_scaling_factor", 1.0))
        kw["use_expert_bias"] = bool(d.get("use_expert_bias", True))
        kw["num_dense_layers"] = int(d.get("num_dense_layers", 2))


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
    else:  # qwen3_5_moe: every layer routed, top-k always renormalised
        kw["norm_topk_prob"] = True


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
    if c.family == "qwen3_moe":
        d.update(
            num_experts=c.num_experts,
            num_experts_per_tok=c.num_experts_per_tok,
            moe_intermediate_size=c.moe_intermediate_size,
            norm_topk_prob=c.norm_topk_prob,
            decoder_sparse_step=c.decoder_sparse_step,
            mlp_only_layers=list(c.mlp_only_layers),
        )
    if c.family in ("gemma3_text", "gemma4_text"):
        d.update(
            hidden_activation=c.hidden_act,
            sliding_window=c.sliding_window,
            layer_types=list(c.layer_types or ()),
            rope_local_base_freq=c.rope_local_base_freq,
            query_pre_attn_scalar=c.query_pre_attn_scalar,
            final_logit_softcapping=c.final_logit_softcapping,
            attn_logit_softcapping=c.attn_logit_softcapping,
        )
    if c.family == "gpt_oss":
        d.update(
            sliding_window=c.sliding_window,
            layer_types=list(c.layer_types or ()),
            num_local_experts=c.num_experts,
            num_experts_per_tok=c.num_experts_per_tok,
            swiglu_limit=c.swiglu_limit,
            swiglu_alpha=c.swiglu_alpha,
        )
    if c.family == "gemma4_text":
        for k in ("rope_theta", "rope_scaling", "rope_local_base_freq", "query_pre_attn_scalar",
                  "attn_logit_softcapping"):
            d.pop(k)
        full = [i for i, s in enumerate(c.is_sliding) if not s]
        d.update(
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": c.rope_theta,
                                                **(c.rope_scaling or {})},
                             "sliding_attention": {"rope_type": "default", "rope_theta": c.rope_local_base_freq}},
            per_layer_config={str(i): {"head_dim": c.layer_head_dim(i), "num_key_value_heads": c.layer_kv_heads(i)}
                              for i in full},
            attention_k_eq_v=c.attention_k_eq_v,
            num_kv_shared_layers=c.num_kv_shared_layers,
            hidden_size_per_layer_input=c.per_layer_input_size,
            vocab_size_per_layer_input=c.per_layer_vocab_size or c.vocab_size,
            use_double_wide_mlp=c.double_wide_mlp,
            enable_moe_block=c.enable_moe_block,
        )
        if c.enable_moe_block:
            d.update(num_experts=c.num_experts, top_k_experts=c.num_experts_per_tok,
                     moe_intermediate_size=c.moe_intermediate_size)
    if c.family in ("lfm2", "lfm2_moe"):
        d.update(norm_eps=c.rms_norm_eps, layer_types=list(c.layer_types or ()), conv_L_cache=c.conv_kernel_size,
                 conv_bias=c.conv_bias, block_auto_adjust_ff_dim=False)  # intermediate_size is the real one
        if c.family == "lfm2_moe":
            d.update(num_experts=c.num_experts, num_experts_per_tok=c.num_experts_per_tok,
                     moe_intermediate_size=c.moe_intermediate_size, norm_topk_prob=c.norm_topk_prob,
                     routed_scaling_factor=c.routed_scaling_factor, use_expert_bias=c.use_expert_bias,
                     num_dense_layers=c.num_dense_layers)
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
