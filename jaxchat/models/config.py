"""The model configuration: `ModelConfig`, `ModelLoadError`, and the generic reader / writer of HF
`config.json` dicts (transformers 4.x and 5.x layouts). A leaf module: it imports nothing from `jaxchat`.

Contract:
- `ModelConfig` is a frozen, hashable description of one decoder-only family (hashable so that it can
  be a static jit argument); heads that do not group raise `ModelLoadError`, the error of a checkpoint
  that cannot be loaded (its message names the offending tensor, field or file). `ModelConfig.is_sparse`
  says per layer whether its MLP is the routed one; `layer_head_dim(i)`, `layer_kv_heads(i)` and
  `kv_sources` (the layer whose k/v a KV-shared layer reuses) give the per-layer shapes.
- A family states its config.json fields in one table of `HF` rows (its module's `HF_CONFIG`: field,
  keys, default, converter, GGUF key); `SHARED` holds the fields every family has. `config_from_hf(d,
  family, rows, hook)` walks `SHARED` + the rows (rope fields in either the 4.x form, `rope_theta`,
  `rope_scaling`, `rope_local_base_freq`, or 5.x's `rope_parameters`, see `rope_view`; rope types in
  `SUPPORTED_ROPE`); a missing required field or an unsupported value raises `ModelLoadError` naming it.
  `config_to_hf(cfg, rows, hook)` writes a 4.x-style dict that `config_from_hf` reads back to an equal
  config. The registry (`families.from_hf_config` / `to_hf_config`) picks the family's table.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any


class ModelLoadError(ValueError):
    """A checkpoint cannot be loaded: the message names the offending tensor, field or file."""


@dataclass(frozen=True)
class ModelConfig:
    family: str  # one of `families.FAMILIES`
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
    linear_conv_kernel_dim: int = 4  # the short causal convolution's window over q, k and v
    linear_key_head_dim: int = 0  # the DeltaNet state is [value heads, key dim, value dim] per row
    linear_value_head_dim: int = 0
    linear_num_key_heads: int = 0  # q and k heads (each shared by value_heads / key_heads value heads)
    linear_num_value_heads: int = 0
    # the shared expert (qwen3_next, qwen3_5_moe)
    shared_expert_intermediate_size: int = 0
    # tokens
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default=())

    def __post_init__(self):
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

    def replace(self, **kw: Any) -> ModelConfig:
        return replace(self, **kw)


# ---- config.json: the shared fields and the reader/writer that walks a family's table ---------------------

SUPPORTED_ROPE = ("default", "llama3", "linear", "yarn", "proportional")
REQUIRED = object()  # `HF.default` of a field config.json must give


@dataclass(frozen=True)
class HF:
    """One `ModelConfig` field as `config.json` (and GGUF metadata) states it: a row of a family's table.

    `keys` are read in order, the first one present (not None, not empty) wins; `out` (default `keys[0]`) is
    the key written. No `keys`: a constant of the family (`default`, or `derive`), never read or written.
    A missing value is `derive(fields read so far, config dict)` when given, else `default` (`REQUIRED`
    raises naming the key). `conv` turns every value that is not None into the field's type (and may
    raise `ModelLoadError`); `put` turns the field's value into the one written where transformers types it
    otherwise (e.g. `whole`). `gguf`: the GGUF metadata key that gives it (after "<arch>.").
    `field=None` is a check only: a true value of `keys[0]` is not supported by the family."""

    field: str | None
    keys: str | tuple[str, ...] = ()
    default: Any = REQUIRED
    conv: Callable[[Any], Any] | None = None
    derive: Callable[[dict, dict], Any] | None = None
    out: str | None = None
    put: Callable[[Any], Any] | None = None
    gguf: str | None = None

    def __post_init__(self):
        if isinstance(self.keys, str):
            object.__setattr__(self, "keys", (self.keys,))
        if not self.keys and self.default is REQUIRED and self.derive is None:
            raise TypeError(f"HF({self.field!r}): a constant needs a default or derive")

    @property
    def key(self) -> str:
        """The key written (and named by errors)."""
        return self.out or self.keys[0]


def _missing(v) -> bool:
    return v is None or (isinstance(v, list | tuple | dict | str) and not v)


def ints(v) -> tuple[int, ...]:
    return tuple(int(i) for i in v)


def whole(v: float) -> float | int:
    """A float written as an int when it is one (for config fields transformers types as int)."""
    return int(v) if float(v).is_integer() else v


def eos_ids(eos) -> tuple[int, ...]:
    return tuple(int(e) for e in eos) if isinstance(eos, list | tuple) else (int(eos),)


def rope_scaling(rs: dict | None, where: str = "rope_scaling") -> dict | None:
    """A rope scaling dict in the form `ModelConfig.rope_scaling` keeps (None for the default rope)."""
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


def layer_types_of(allowed: tuple[str, ...]) -> Callable[[Any], tuple[str, ...]]:
    """A `conv` for `layer_types` that only admits `allowed` entries."""
    def conv(types) -> tuple[str, ...]:
        bad = [t for t in types if t not in allowed]
        if bad:
            raise ModelLoadError(f"config.json: layer_types entry {bad[0]!r} is not supported (supported: {allowed})")
        return tuple(types)
    return conv


SHARED = (  # every family's fields; a family's row for the same field replaces the shared one, in place
    HF("vocab_size", "vocab_size", conv=int, gguf="vocab_size"),
    HF("hidden_size", "hidden_size", conv=int, gguf="embedding_length"),
    HF("intermediate_size", "intermediate_size", conv=int, gguf="feed_forward_length"),
    HF("num_layers", "num_hidden_layers", conv=int, gguf="block_count"),
    HF("num_heads", "num_attention_heads", conv=int, gguf="attention.head_count"),
    HF("num_kv_heads", "num_key_value_heads", conv=int, derive=lambda kw, d: kw["num_heads"],
       gguf="attention.head_count_kv"),
    HF("head_dim", "head_dim", conv=int, derive=lambda kw, d: kw["hidden_size"] // kw["num_heads"],
       gguf="attention.key_length"),
    HF("rms_norm_eps", "rms_norm_eps", 1e-6, float, gguf="attention.layer_norm_rms_epsilon"),
    HF("rope_theta", "rope_theta", 10000.0, float, gguf="rope.freq_base"),
    HF("rope_scaling", "rope_scaling", None, rope_scaling),
    HF("max_position_embeddings", "max_position_embeddings", 4096, int, gguf="context_length"),
    HF("tie_word_embeddings", "tie_word_embeddings", False, bool),
    HF("attention_bias", "attention_bias", False, bool),
    HF("hidden_act", ("hidden_act", "hidden_activation"), "silu", str),
    HF("bos_token_id", "bos_token_id", None),
    HF("eos_token_ids", "eos_token_id", (), eos_ids),
)
EXPERTS = (  # the routed-experts fields most MoE families read under these names
    HF("num_experts", "num_experts", conv=int),
    HF("num_experts_per_tok", "num_experts_per_tok", conv=int),
    HF("moe_intermediate_size", "moe_intermediate_size", conv=int),
)


def table(family_rows: tuple[HF, ...] = ()) -> tuple[HF, ...]:
    """`SHARED` with a family's rows: a row for a field already there replaces it in place (later rows
    may derive from earlier fields), new fields follow in order; check-only rows are kept."""
    rows: dict = {r.field: r for r in SHARED}
    for r in family_rows:
        rows[r.field if r.field is not None else ("check", r.keys)] = r
    return tuple(rows.values())


def read_fields(d: dict, rows: tuple[HF, ...], family: str, kw: dict | None = None) -> dict:
    """The fields `rows` read from the config dict `d` (added to `kw`, which `derive` sees)."""
    kw = {} if kw is None else kw
    for r in rows:
        if r.field is None:
            if d.get(r.keys[0]):
                raise ModelLoadError(f"config.json: {r.keys[0]}={json.dumps(d[r.keys[0]])} is not supported "
                                     f"for {family}")
            continue
        v = next((d[k] for k in r.keys if not _missing(d.get(k))), None)
        if v is None:
            v = r.derive(kw, d) if r.derive is not None else r.default
            if v is REQUIRED:
                raise ModelLoadError(f"config.json: missing required field {r.key!r}")
        kw[r.field] = r.conv(v) if r.conv is not None and v is not None else v
    return kw


def write_fields(c: ModelConfig, rows: tuple[HF, ...]) -> dict:
    """The config.json keys of `rows` (tuples as lists, dicts copied); constants and checks are not written."""
    out = {}
    for r in rows:
        if r.field is not None and r.keys:
            v = getattr(c, r.field)
            v = r.put(v) if r.put is not None and v is not None else v
            out[r.key] = list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, dict) else v
    return out


def rope_view(d: dict) -> dict:
    """`d` with the rope fields in the 4.x form (`rope_theta`, `rope_scaling`, `rope_local_base_freq`,
    `partial_rotary_factor`), read from 5.x's `rope_parameters` (per layer type for gemma3 / gemma4) when given."""
    rp = d.get("rope_parameters")
    theta, scaling, local = d.get("rope_theta"), d.get("rope_scaling"), d.get("rope_local_base_freq")
    partial = d.get("partial_rotary_factor")
    if isinstance(rp, dict) and rp:
        if rp.get("partial_rotary_factor") is not None:
            partial = rp["partial_rotary_factor"]
        if "full_attention" in rp or "sliding_attention" in rp:
            scaling = rp.get("full_attention", {})
            theta = scaling.get("rope_theta", theta)
            local = rp.get("sliding_attention", {}).get("rope_theta", local)
        else:
            theta, scaling = rp.get("rope_theta", theta), rp
    return {**d, "rope_theta": theta, "rope_scaling": scaling, "rope_local_base_freq": local,
            "partial_rotary_factor": partial}


def config_from_hf(d: dict, family: str, rows: tuple[HF, ...] = (), hook=None) -> ModelConfig:
    """The `ModelConfig` of `family` from its config dict: `SHARED` and the family's `rows`, then its
    `hook(d, kw)` for what a table cannot say (checks across fields, nested dicts)."""
    d = rope_view(d)
    kw = read_fields(d, table(rows), family)
    if hook is not None:
        hook(d, kw)
    rs = kw["rope_scaling"]
    if rs and rs["rope_type"] == "yarn":
        if rs.get("original_max_position_embeddings") is None:
            raise ModelLoadError("config.json: rope_scaling.original_max_position_embeddings is required for yarn")
        if rs.get("factor") is None:  # as transformers: the context extension ratio
            rs["factor"] = kw["max_position_embeddings"] / float(rs["original_max_position_embeddings"])
    return ModelConfig(family=family, **kw)


def config_to_hf(c: ModelConfig, rows: tuple[HF, ...] = (), hook=None) -> dict:
    """A 4.x-style config.json dict of `c` that `config_from_hf` reads back to an equal config."""
    d = {"model_type": c.family, **write_fields(c, table(rows))}
    if hook is not None:
        hook(c, d)
    return d
