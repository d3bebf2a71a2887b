"""The model interface the engine codes against: config, loaded model, cache, loading entry points.

Contract:
- `ModelConfig` is a frozen description of one decoder-only family ("llama", "qwen2", "qwen3",
  "gemma3_text"), built from an HF `config.json` dict (`from_hf_config`) or GGUF metadata.
- `LoadedModel.forward(params, tokens, positions, cache_k, cache_v) -> (logits, cache_k, cache_v)`
  is pure and jit-able (it closes over the graphdef and config only):
    tokens int32[B, T]; positions int32[B, T], the absolute position of each token, -1 = padding
    (not written to the cache, its logits are garbage and must be ignored);
    cache_k / cache_v: [num_layers, B, S, num_kv_heads, head_dim] in the model dtype, S = max context.
  For each row b and step t, the token's k/v is written at cache[:, b, positions[b, t]], then the
  token attends to every cache position p <= positions[b, t] of its row (on gemma3 sliding layers
  also p > positions[b, t] - sliding_window). Positions of a row must have been written by that
  row's own sequence (earlier calls or this one); stale entries beyond the position are masked.
  Returns float32 logits [B, T, vocab_size] and the updated caches. Prefill (T > 1) and decode
  (T == 1) are the same function; donate the caches when jitting.
  Extensions (keyword-only, defaults give the above): `row_offset` (int32 scalar, may be traced): the
  cache may hold more rows Bc >= B, and token row b uses cache row row_offset + b (rows outside are
  untouched); `logits_index` int32[B]: return only the logits at that step of each row, [B, 1, vocab]
  (prefill needs one position, not the whole bucket); `attend_len` (static int): every position in the
  batch is below it, so attention reads only the first attend_len cache positions (every write is below
  them); `head_vd` [vocab, hidden] (`vocab_major_head(params)`, a copy of the lm head
  stored vocab-major): the logits are computed from it instead (same values; faster for several rows
  on CPU, see `layers.vocab_major_logits`).
- Fast layout (what the engine uses on CPU): `unstack_layers(params)` splits the stacked layers into
  a tuple of per-layer dicts (zero-copy on one CPU device) and `layer_cache(config, B, S)` gives
  per-layer caches, per layer a tuple of position chunks (cut at the attention spans the caller will
  use, `spans=`), keys [B, num_kv_heads, head_dim, w] (transposed) and values [B, num_kv_heads, w,
  head_dim]; with `attend_len` only the chunks below it are written and read. With these the
  forward is a Python loop over layers (no per-layer dynamic slice of weights or cache, which XLA on
  CPU copies) and returns the caches as tuples. Stacked params with the stacked cache scan the layers
  (compact program, preferred on accelerators).
- `params` is a plain nested dict of jax arrays (the flax nnx state split once, as a pure dict);
  layer parameters are stacked on a leading `num_layers` axis.
- `partition_specs(mesh)` gives a matching pytree of `PartitionSpec`s: tensor parallel over
  attention heads, MLP hidden units and the vocabulary along the mesh axis 'tp' (an axis whose size
  does not divide by the 'tp' size is replicated). `cache_partition_spec(mesh)` does the same for
  the KV cache (kv heads over 'tp').
- `load_model(path, dtype, mesh)` auto-detects an HF safetensors directory, a `.gguf` file or an
  orbax checkpoint directory (written by `save_orbax`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

FAMILIES = ("llama", "qwen2", "qwen3", "gemma3_text")


class ModelLoadError(ValueError):
    """A checkpoint cannot be loaded: the message names the offending tensor, field or file."""


@dataclass(frozen=True)
class ModelConfig:
    family: str
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
        from jaxchat.models.config import to_hf_config

        return to_hf_config(self)

    @classmethod
    def from_hf_config(cls, hf: dict) -> ModelConfig:
        from jaxchat.models.config import from_hf_config

        return from_hf_config(hf)

    def replace(self, **kw: Any) -> ModelConfig:
        return replace(self, **kw)


class LoadedModel:
    """A model ready to run: config, params (pure dict of arrays), the nnx graphdef and the tokenizer."""

    def __init__(self, config: ModelConfig, graphdef, params: dict, dtype, tokenizer=None,
                 chat_template: str | None = None, eos_token_ids: tuple[int, ...] | None = None,
                 bos_token_id: int | None = None, mesh=None, source: str = ""):
        self.config = config
        self.graphdef = graphdef
        self.params = params
        self.dtype = dtype
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.eos_token_ids = tuple(eos_token_ids if eos_token_ids is not None else config.eos_token_ids)
        self.bos_token_id = bos_token_id if bos_token_id is not None else config.bos_token_id
        self.mesh = mesh
        self.source = source

    def forward(self, params, tokens, positions, cache_k, cache_v, *, row_offset=0, logits_index=None,
                attend_len=None, head_vd=None):
        """Pure forward over the cache; see the module docstring for the contract."""
        from flax import nnx

        layers = params["layers"]
        if isinstance(layers, (tuple, list)):  # unstacked (see `unstack_layers`): a Python loop over layers
            module = nnx.merge(self.graphdef, {**params, "layers": layers[0]})  # layer 0 gives the structure
            return module(tokens, positions, cache_k, cache_v, row_offset, logits_index,
                          layer_states=tuple(layers), attend_len=attend_len, head_vd=head_vd)
        module = nnx.merge(self.graphdef, params)
        return module(tokens, positions, cache_k, cache_v, row_offset, logits_index, attend_len=attend_len,
                      head_vd=head_vd)

    def lm_head_weight(self, params):
        """The lm head's [hidden, vocab] param: the tied embedding table or `lm_head`."""
        return params["embed"] if self.config.tie_word_embeddings else params["lm_head"]

    def vocab_major_head(self, params):
        """The lm head as a new [vocab, hidden] array (`lm_head_weight`, transposed)."""
        import jax.numpy as jnp

        return jnp.transpose(self.lm_head_weight(params)).copy()

    def unstack_layers(self, params) -> dict:
        return unstack_layers(params)

    def layer_cache(self, batch: int, max_len: int, spans=()):
        return layer_cache(self.config, batch, max_len, self.dtype, spans)

    def partition_specs(self, mesh) -> dict:
        from jaxchat.models.sharding import param_partition_specs

        return param_partition_specs(self.config, self.params, mesh)

    def cache_partition_spec(self, mesh):
        from jaxchat.models.sharding import cache_partition_spec

        return cache_partition_spec(self.config, mesh)

    def empty_cache(self, batch: int, max_len: int):
        return empty_cache(self.config, batch, max_len, self.dtype)

    def __repr__(self) -> str:
        c = self.config
        return (f"LoadedModel({c.family}, layers={c.num_layers}, hidden={c.hidden_size}, "
                f"vocab={c.vocab_size}, dtype={self.dtype}, source={self.source!r})")


def empty_cache(config: ModelConfig, batch: int, max_len: int, dtype="float32"):
    """Zeroed (cache_k, cache_v), each [num_layers, batch, max_len, num_kv_heads, head_dim]."""
    import jax.numpy as jnp

    shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
    return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)


def layer_cache(config: ModelConfig, batch: int, max_len: int, dtype="float32", spans=()):
    """Zeroed per-layer caches, each layer cut along positions at every span in `spans` below max_len (none:
    one chunk), each chunk its own buffer: keys, a tuple of num_layers tuples of [batch, num_kv_heads,
    head_dim, w] (stored transposed, so decode attention is a plain batched matmul), and values, the same
    of [batch, num_kv_heads, w, head_dim]. Attending over one of those spans (`attend_len`) then reads and
    writes whole buffers: on CPU, slicing a prefix out of one buffer is a copy that cost more than the
    attention itself."""
    import jax.numpy as jnp

    kv, hd = config.num_kv_heads, config.head_dim
    ends = sorted({int(s) for s in spans if 0 < int(s) < max_len} | {max_len})
    widths = [end - start for start, end in zip([0, *ends[:-1]], ends, strict=True)]
    return (tuple(tuple(jnp.zeros((batch, kv, hd, w), dtype) for w in widths) for _ in range(config.num_layers)),
            tuple(tuple(jnp.zeros((batch, kv, w, hd), dtype) for w in widths) for _ in range(config.num_layers)))


def unstack_layers(params: dict) -> dict:
    """`params` with `params["layers"]` split into a tuple of per-layer dicts, each layer its own buffers.

    On a single CPU device the layers are zero-copy views of the stacked buffers (no extra memory);
    otherwise (sharded, accelerators) they are copies that keep the stacked arrays' shardings.
    """
    import jax
    import numpy as np

    stacked = params["layers"]
    leaves, tree = jax.tree.flatten(stacked)
    n = leaves[0].shape[0]

    def split(x):
        devs = x.sharding.device_set if isinstance(x, jax.Array) else set()
        if len(devs) == 1 and next(iter(devs)).platform == "cpu":
            view = np.asarray(x)  # shares the buffer; device_put of an aligned view is zero-copy on CPU
            dev = jax.sharding.SingleDeviceSharding(next(iter(devs)))
            return [jax.device_put(view[i], dev) for i in range(n)]
        return [x[i] for i in range(n)]

    per_leaf = [split(x) for x in leaves]
    layers = tuple(jax.tree.unflatten(tree, [p[i] for p in per_leaf]) for i in range(n))
    return {**params, "layers": layers}


def load_model(path: str | Path, dtype: str = "float32", mesh=None) -> LoadedModel:
    """Load an HF safetensors directory, a `.gguf` file or an orbax checkpoint directory."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        from jaxchat.models.gguf_loader import load_gguf

        return load_gguf(path, dtype=dtype, mesh=mesh)
    if path.is_dir() and (path / "jaxchat_orbax.json").exists():
        from jaxchat.models.orbax_io import load_orbax

        return load_orbax(path, dtype=dtype, mesh=mesh)
    if path.is_dir() and (path / "config.json").exists():
        from jaxchat.models.hf_loader import load_hf

        return load_hf(path, dtype=dtype, mesh=mesh)
    if not path.exists():
        raise ModelLoadError(f"model path {str(path)!r} does not exist")
    raise ModelLoadError(f"model path {str(path)!r} is not a .gguf file, an HF directory with config.json, "
                         "or a jaxchat orbax checkpoint")


def save_orbax(model: LoadedModel, dst: str | Path) -> Path:
    """Write params + config.json + tokenizer files to `dst`, loadable on its own by `load_model`."""
    from jaxchat.models.orbax_io import save_orbax as _save

    return _save(model, dst)


def gelu_tanh_name(act: str) -> bool:
    return act in ("gelu_pytorch_tanh", "gelu_tanh", "gelu")


def embed_scale(config: ModelConfig) -> float:
    return math.sqrt(config.hidden_size) if config.family == "gemma3_text" else 1.0
