"""The model interface the engine codes against: the loaded model, its forward, its caches, and the
description of how the engine's step runner runs it (`StepModel`).

Contract:
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
  on CPU, see `layers.vocab_major_logits`); `layout` (static, see below); `mixed` (static (B, K, C), only
  where `StepModel.mixed_steps`): tokens and positions are [1, B + K*C], B decode tokens for cache rows
  0..B-1 then K chunks of C tokens for rows row_offset..row_offset+K-1, and `logits_index` is [1, N]
  (`layers.attend_cached`).
- Two layouts, named by `layout` and never guessed from the arrays: "stacked" (the default): layer
  params stacked on a leading `num_layers` axis and the stacked cache above; the layers are scanned
  (compact program, preferred on accelerators). "unrolled" (what the engine uses on CPU):
  `unstack_layers(params)` splits the stacked layers into a tuple of per-layer dicts (zero-copy on one
  CPU device) and `layer_cache(config, B, S, spans=)` gives per-layer caches, per layer a tuple of
  position chunks (cut at the attention spans the caller will use), keys [B, num_kv_heads, head_dim, w]
  (transposed) and values [B, num_kv_heads, w, head_dim]; with `attend_len` only the chunks below it
  are written and read. The forward is then a Python loop over layers (no per-layer dynamic slice of
  weights or cache, which XLA on CPU copies) and returns the caches as tuples of tuples.
- Listed families (`layers.CausalLM.stacked` False: layers of different shapes) have one layout, the
  per-layer one: params["layers"] is a tuple of per-layer dicts, the cache per layer (`layer_cache`,
  which `empty_cache` also returns for them), and `forward` runs it whatever `layout` says;
  `step_model` gives "unrolled" on every platform.
- `LoadedModel.step_model(params, platform) -> StepModel`: everything the step runner needs, stated
  instead of probed: the layout for that platform ("unrolled" on "cpu", else "stacked"), the params
  in that layout, the forward with the layout bound, the cache builder
  `new_cache(batch, max_len, spans) -> (cache_k, cache_v)`, whether the forward takes `attend_len`,
  and (unrolled only) the builder of the vocab-major head copy `vocab_major_head(params, mesh)`.
- `params` is a plain nested dict of jax arrays (the flax nnx state split once, as a pure dict).
- `partition_specs(mesh)` gives a matching pytree of `PartitionSpec`s: tensor parallel over
  attention heads, MLP hidden units and the vocabulary along the mesh axis 'tp' (an axis whose size
  does not divide by the 'tp' size is replicated). `cache_partition_spec(mesh)` does the same for
  the stacked KV cache (kv heads over 'tp').
- `ModelConfig` and `ModelLoadError` live in `config`; `load_model` / `save_orbax` in `load`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

from jaxchat.models.config import ModelConfig

Layout = Literal["stacked", "unrolled"]


class RecurrentState(NamedTuple):
    """A layer's per-row state that is not a KV cache (`CausalLM.cache_dims`): a convolution window, a
    recurrent matrix. `layer_cache` gives the layer one zeroed array [batch, *shape] per shape as its
    cache_k entry (cache_v is empty); a row's state is the model's to reset (at position 0) and advance."""

    shapes: tuple[tuple[int, ...], ...]
    dtype: str | None = None  # None: the model dtype


class StepModel(NamedTuple):
    """How the step runner runs a model: built by the model (`LoadedModel.step_model`), never probed."""

    layout: Layout  # "stacked": one cache [L, B, S, KV, D]; "unrolled": per layer a tuple of position chunks
    params: Any  # the params in that layout
    forward: Callable  # the pure forward over params of that layout (`LoadedModel.forward`'s contract)
    new_cache: Callable[[int, int, Sequence[int]], tuple[Any, Any]]  # (batch, max_len, spans) -> zeroed caches
    attention_spans: bool  # the forward takes `attend_len` (reads only a prefix of the cache)
    vocab_major_head: Callable[[Any, Any], Any] | None  # (params, mesh) -> the head_vd copy; None: not used
    # every layer's cache is indexed by position (no RecurrentState), so a row's first n positions stay valid
    # for any continuation of its first n tokens (prefix reuse)
    prefix_reuse: bool = True
    # the forward takes `mixed`: decode tokens and prompt chunks in one call (the step runner's mixed steps)
    mixed_steps: bool = False


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
        self.quantize: str | None = None  # "int8": the matmul weights are `quant.Int8Weight`s
        from jaxchat.models.families import is_stacked

        self.stacked = is_stacked(config)  # False: a listed family (`layers.CausalLM`), unrolled only

    def forward(self, params, tokens, positions, cache_k, cache_v, *, row_offset=0, logits_index=None,
                attend_len=None, head_vd=None, layout: Layout = "stacked", mixed=None):
        """Pure forward over the cache, params and cache in `layout`; see the module docstring."""
        from flax import nnx

        if mixed is not None and not self.mixed_steps:
            raise ValueError(f"{self.config.family} does not run mixed steps")
        extra = {"head_vd": head_vd} if mixed is None else {"head_vd": head_vd, "mixed": mixed}
        if not self.stacked:  # a listed family: its per-layer params and caches are its only layout
            module = nnx.merge(self.graphdef, {**params, "layers": dict(enumerate(params["layers"]))})
            return module(tokens, positions, cache_k, cache_v, row_offset, logits_index, attend_len=attend_len,
                          **extra)
        if layout == "unrolled":  # per-layer params (`unstack_layers`): a Python loop over the layers
            layers = params["layers"]
            module = nnx.merge(self.graphdef, {**params, "layers": layers[0]})  # layer 0 gives the structure
            return module(tokens, positions, cache_k, cache_v, row_offset, logits_index,
                          layer_states=tuple(layers), attend_len=attend_len, **extra)
        module = nnx.merge(self.graphdef, params)
        return module(tokens, positions, cache_k, cache_v, row_offset, logits_index, attend_len=attend_len,
                      **extra)

    def step_model(self, params, platform: str) -> StepModel:
        """How the engine's step runner runs this model, with `params` (placed), on devices of `platform`.

        On "cpu" the layout is "unrolled": per-layer weight and cache buffers avoid XLA:CPU copying each
        layer's weights and cache out of the stacked arrays on every step, and a vocab-major head copy
        speeds up batched logits (`docs/benchmarks.md` has the numbers). Elsewhere the stacked layers are scanned. The
        forward is `self.forward` with the layout bound (so a wrapper installed on `model.forward` sees
        every step)."""
        if not self.stacked:
            return StepModel(layout="unrolled", params=params, forward=functools.partial(self.forward, layout="unrolled"),
                             new_cache=self.layer_cache, attention_spans=True,
                             vocab_major_head=self.vocab_major_head if platform == "cpu" else None,
                             prefix_reuse=self.positional_cache, mixed_steps=self.mixed_steps)
        if platform == "cpu":
            return StepModel(layout="unrolled", params=unstack_layers(params),
                             forward=functools.partial(self.forward, layout="unrolled"),
                             new_cache=self.layer_cache, attention_spans=True,
                             vocab_major_head=self.vocab_major_head, prefix_reuse=self.positional_cache,
                             mixed_steps=self.mixed_steps)

        def stacked_cache(batch: int, max_len: int, spans: Sequence[int] = ()):
            return self.empty_cache(batch, max_len)  # one buffer over all positions: spans do not cut it

        return StepModel(layout="stacked", params=params, forward=functools.partial(self.forward, layout="stacked"),
                         new_cache=stacked_cache, attention_spans=True, vocab_major_head=None,
                         prefix_reuse=self.positional_cache, mixed_steps=self.mixed_steps)

    @property
    def mixed_steps(self) -> bool:
        """Whether the forward runs decode tokens and prompt chunks together (`mixed`): a positional cache (a
        recurrent state advances one row's tokens in order, which a chunk beside decode rows would not keep)
        and a family whose attention splits them (`layers.CausalLM.mixed_steps`)."""
        from jaxchat.models.families import family_module

        return self.positional_cache and bool(family_module(self.config.family).Model.mixed_steps)

    @property
    def positional_cache(self) -> bool:
        """Whether every layer's cache is a K/V cache by position (no `RecurrentState`)."""
        from jaxchat.models.families import family_module

        dims = family_module(self.config.family).Model.cache_dims(self.config)
        return not any(isinstance(d, RecurrentState) for d in dims)

    def lm_head_weight(self, params):
        """The lm head's [hidden, vocab] param: the tied embedding table or `lm_head`."""
        return params["embed"] if self.config.tie_word_embeddings else params["lm_head"]

    def vocab_major_head(self, params, mesh=None):
        """The lm head as a new [vocab, hidden] array (`lm_head_weight`, transposed); given a mesh, placed
        with the head's sharding, axes swapped (an int8 head: its values and scales, each)."""
        from jaxchat.models.quant import Int8Weight

        head = self.lm_head_weight(params)
        if isinstance(head, Int8Weight):  # int8: values and scales, each transposed
            return Int8Weight(*(self._vocab_major(a, mesh) for a in (head.values, head.scale)), head.dtype)
        return self._vocab_major(head, mesh)

    @staticmethod
    def _vocab_major(head, mesh):
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        head_vd = jnp.transpose(head).copy()
        if mesh is None:
            return head_vd
        spec = tuple(getattr(head.sharding, "spec", ())) + (None, None)
        return jax.device_put(head_vd, NamedSharding(mesh, P(spec[1], spec[0])))

    def layer_cache(self, batch: int, max_len: int, spans: Sequence[int] = ()):
        return layer_cache(self.config, batch, max_len, self.dtype, spans)

    def partition_specs(self, mesh) -> dict:
        from jaxchat.models.sharding import param_partition_specs

        return param_partition_specs(self.config, self.params, mesh)

    def cache_partition_spec(self, mesh):
        from jaxchat.models.sharding import cache_partition_spec

        return cache_partition_spec(self.config, mesh)

    def empty_cache(self, batch: int, max_len: int):
        """The stacked cache (see `empty_cache`; a listed family's per-layer one)."""
        return empty_cache(self.config, batch, max_len, self.dtype)

    def __repr__(self) -> str:
        c = self.config
        return (f"LoadedModel({c.family}, layers={c.num_layers}, hidden={c.hidden_size}, "
                f"vocab={c.vocab_size}, dtype={self.dtype}, source={self.source!r})")


def empty_cache(config: ModelConfig, batch: int, max_len: int, dtype="float32"):
    """Zeroed (cache_k, cache_v), each [num_layers, batch, max_len, num_kv_heads, head_dim]; for a listed
    family (layers of different shapes) its per-layer cache in one chunk (`layer_cache`)."""
    import jax.numpy as jnp

    from jaxchat.models.families import is_stacked

    if not is_stacked(config):
        return layer_cache(config, batch, max_len, dtype)

    shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
    return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)


def layer_cache(config: ModelConfig, batch: int, max_len: int, dtype="float32", spans=()):
    """Zeroed per-layer caches, each layer cut along positions at every span in `spans` below max_len (none:
    one chunk), each chunk its own buffer: keys, a tuple of num_layers tuples of [batch, num_kv_heads,
    head_dim, w] (stored transposed, so decode attention is a plain batched matmul), and values, the same
    of [batch, num_kv_heads, w, head_dim]; num_kv_heads and head_dim per layer as the family's
    `Model.cache_dims` gives them, a layer without a cache of its own gets empty tuples, and a layer with
    a `RecurrentState` gets its state arrays [batch, *shape] as keys and no values. Attending
    over one of those spans (`attend_len`) then reads and
    writes whole buffers: on CPU, slicing a prefix out of one buffer is a copy that cost more than the
    attention itself."""
    import jax.numpy as jnp

    from jaxchat.models.families import family_module

    dims = family_module(config.family).Model.cache_dims(config)  # per layer (kv heads, head dim) or None
    ends = sorted({int(s) for s in spans if 0 < int(s) < max_len} | {max_len})
    widths = [end - start for start, end in zip([0, *ends[:-1]], ends, strict=True)]

    def chunks(dim, shape, is_key: bool):
        if dim is None:
            return ()
        if isinstance(dim, RecurrentState):
            return tuple(jnp.zeros((batch, *s), dim.dtype or dtype) for s in dim.shapes) if is_key else ()
        return tuple(jnp.zeros(shape(*dim, w), dtype) for w in widths)

    return (tuple(chunks(d, lambda kv, hd, w: (batch, kv, hd, w), True) for d in dims),
            tuple(chunks(d, lambda kv, hd, w: (batch, kv, w, hd), False) for d in dims))


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
