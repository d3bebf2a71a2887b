"""The model interface the engine codes against: the loaded model, its forward over a ragged step, its KV
pool's layers, and the description of how the engine's step runner runs it (`StepModel`).

Contract:
- `LoadedModel.forward(params, tokens, pools, step, backend, *, uniform=None, logits_index=None, head_vd=None,
  layout="stacked") -> (logits, pools)` is pure and jit-able (it closes over the graphdef and config only):
    tokens int32[T], the flat step; `step` a `kv.StepInputs` (positions, rows, page tables, write slots,
    state slots); `backend` the attention backend that owns the pool's layout (static, an engine object:
    `jaxchat.engine.attention_xla.XlaAttention` on every platform); `uniform` (static (R, Q) or None): every
    row owns Q consecutive token slots (needed by recurrent layers); `logits_index` int32[N]: the tokens whose
    logits are wanted (None: all) -> float32 logits [N, vocab_size]; `head_vd` [vocab, hidden]
    (`vocab_major_head(params)`, a copy of the lm head stored vocab-major): the logits are computed from it
    instead (same values; faster for several rows on CPU, see `layers.vocab_major_logits`).
  Each token's K/V is written at its write slot, then it attends to its row's positions <= its own (sliding
  layers: within the window); recurrent layers advance their rows' state slots. Donate the pools when jitting.
- `new_pools(backend, num_pages, page_size, num_slots, layout)`: zeroed pools, per the family's `cache_dims`:
  an attention layer's pages in the backend's layout, a `RecurrentState` layer's state arrays [num_slots, ...]
  (a tuple), a KV-shared layer nothing (`()`). "stacked": one stacked pair of page arrays for all layers (every
  layer alike); "unrolled": a tuple with one entry per layer.
- Two layouts, named by `layout` and never guessed from the arrays: "stacked" (the default): layer params
  stacked on a leading `num_layers` axis and the stacked pool; the layers are scanned (compact program,
  preferred on accelerators). "unrolled" (what the engine uses on CPU): `unstack_layers(params)` splits the
  stacked layers into a tuple of per-layer dicts (zero-copy on one CPU device) and the pool is per layer, so
  the forward is a Python loop over layers (no per-layer dynamic slice of weights or pages, which XLA on CPU
  copies).
- Listed families (`layers.CausalLM.stacked` False: layers of different shapes) have one layout, the
  per-layer one: params["layers"] is a tuple of per-layer dicts, and `forward` runs it whatever `layout` says;
  `step_model` gives "unrolled" on every platform.
- `LoadedModel.step_model(params, platform) -> StepModel`: everything the step runner needs, stated instead of
  probed: the layout for that platform ("unrolled" on "cpu", else "stacked"), the params in that layout, the
  forward with the layout bound, the pool builder, (unrolled only, CPU) the builder of the vocab-major head
  copy `vocab_major_head(params, mesh)`, and whether every layer's cache is positional (`prefix_reuse`: pages
  can be shared and steps may be ragged; a recurrent state needs uniform steps and recomputes from scratch).
- `params` is a plain nested dict of jax arrays (the flax nnx state split once, as a pure dict).
- `partition_specs(mesh)` gives a matching pytree of `PartitionSpec`s: tensor parallel over
  attention heads, MLP hidden units and the vocabulary along the mesh axis 'tp' (an axis whose size
  does not divide by the 'tp' size is replicated).
- `ModelConfig` and `ModelLoadError` live in `config`; `load_model` / `save_orbax` in `load`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
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

    layout: Layout  # "stacked": one stacked pool; "unrolled": per-layer pools
    params: Any  # the params in that layout
    forward: Callable  # the pure forward over params of that layout (`LoadedModel.forward`'s contract)
    new_pools: Callable[..., Any]  # (backend, num_pages, page_size, num_slots) -> zeroed pools
    vocab_major_head: Callable[[Any, Any], Any] | None  # (params, mesh) -> the head_vd copy; None: not used
    # every layer's cache is indexed by position (no RecurrentState): full pages can be shared between rows
    # (prefix caching) and rows of one step may run different token counts (ragged steps)
    prefix_reuse: bool = True


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

    def forward(self, params, tokens, pools, step, backend, *, uniform=None, logits_index=None, head_vd=None,
                layout: Layout = "stacked"):
        """Pure forward over one ragged step, params and pools in `layout`; see the module docstring."""
        from flax import nnx

        args = (tokens, pools, step, backend, uniform, logits_index)
        if not self.stacked:  # a listed family: its per-layer params and pools are its only layout
            module = nnx.merge(self.graphdef, {**params, "layers": dict(enumerate(params["layers"]))})
            return module(*args, head_vd=head_vd)
        if layout == "unrolled" or isinstance(params["layers"], tuple):  # per-layer params: a loop over layers
            layers = params["layers"]
            module = nnx.merge(self.graphdef, {**params, "layers": layers[0]})  # layer 0 gives the structure
            return module(*args, layer_states=tuple(layers), head_vd=head_vd)
        module = nnx.merge(self.graphdef, params)
        return module(*args, head_vd=head_vd)

    def step_model(self, params, platform: str, layout: Layout | None = None, consume: bool = False) -> StepModel:
        """How the engine's step runner runs this model, with `params` (placed), on devices of `platform`.

        On "cpu" the layout is "unrolled": per-layer weight and pool buffers avoid XLA:CPU copying each
        layer's weights and pages out of the stacked arrays on every step, and a vocab-major head copy
        speeds up batched logits (`docs/benchmarks.md` has the numbers). Elsewhere the stacked layers are
        scanned; `layout` "unrolled" asks for per-layer buffers there too (an attention kernel that takes one
        layer's pool as a buffer of its own); `consume`: the stacked arrays of `params` are deleted as their
        layers are copied (`unstack_layers`). The forward is `self.forward` with the layout bound (so a wrapper
        installed on `model.forward` sees every step)."""
        cpu = platform == "cpu"
        layout = layout or ("unrolled" if cpu or not self.stacked else "stacked")
        if layout == "unrolled" and self.stacked:
            params = unstack_layers(params, consume)
        return StepModel(layout=layout, params=params, forward=functools.partial(self.forward, layout=layout),
                         new_pools=functools.partial(self.new_pools, layout=layout),
                         vocab_major_head=self.vocab_major_head if cpu else None, prefix_reuse=self.positional_cache)

    def new_pools(self, backend, num_pages: int, page_size: int, num_slots: int, layout: Layout = "stacked"):
        return new_pools(self.config, backend, num_pages, page_size, num_slots, self.dtype,
                         stacked=layout == "stacked" and self.stacked)

    @property
    def positional_cache(self) -> bool:
        """Whether every layer's cache is a K/V cache by position (no `RecurrentState`)."""
        from jaxchat.models.families import family_module

        dims = family_module(self.config.family).Model.cache_dims(self.config)
        return not any(isinstance(d, RecurrentState) for d in dims)

    def kv_dims(self) -> list[tuple[int, int]]:
        """(kv heads, head dim) of every layer with a KV cache of its own (KV-shared and recurrent layers: none)."""
        from jaxchat.models.families import family_module

        dims = family_module(self.config.family).Model.cache_dims(self.config)
        return [tuple(d) for d in dims if d is not None and not isinstance(d, RecurrentState)]

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

        head_vd = jnp.transpose(head)  # a new array: the transpose never aliases its operand
        if mesh is None:
            return head_vd
        spec = tuple(getattr(head.sharding, "spec", ())) + (None, None)
        return jax.device_put(head_vd, NamedSharding(mesh, P(spec[1], spec[0])))

    def partition_specs(self, mesh) -> dict:
        from jaxchat.models.sharding import param_partition_specs

        return param_partition_specs(self.config, self.params, mesh)

    def __repr__(self) -> str:
        c = self.config
        return (f"LoadedModel({c.family}, layers={c.num_layers}, hidden={c.hidden_size}, "
                f"vocab={c.vocab_size}, dtype={self.dtype}, source={self.source!r})")


def new_pools(config: ModelConfig, backend, num_pages: int, page_size: int, num_slots: int, dtype="float32",
              stacked: bool = False):
    """Zeroed pools for `config` (see the module docstring): `stacked` gives one stacked pair of page arrays (a
    stacked family); otherwise a tuple with one entry per layer, from the family's `Model.cache_dims`."""
    import jax.numpy as jnp

    from jaxchat.models.families import family_module

    dims = family_module(config.family).Model.cache_dims(config)  # per layer (kv heads, head dim) or None
    if stacked:
        kv, hd = dims[0]
        return backend.new_pool(num_pages, page_size, kv, hd, dtype, layers=config.num_layers)

    def entry(dim):
        if dim is None:
            return ()
        if isinstance(dim, RecurrentState):
            return tuple(jnp.zeros((num_slots, *shape), dim.dtype or dtype) for shape in dim.shapes)
        return backend.new_pool(num_pages, page_size, *dim, dtype)

    return tuple(entry(d) for d in dims)


def unstack_layers(params: dict, consume: bool = False) -> dict:
    """`params` with `params["layers"]` split into a tuple of per-layer dicts, each layer its own buffers.

    On a single CPU device the layers are zero-copy views of the stacked buffers (no extra memory);
    otherwise (sharded, accelerators) they are copies that keep the stacked arrays' shardings. Abstract params
    (`jax.ShapeDtypeStruct`s, for lowering) give abstract layers with those shardings. `consume`: each copied
    stacked array is deleted once its layers exist (one copy of the weights, and at most one stacked tensor
    more at any moment); the caller must not use `params` again.
    """
    import jax
    import numpy as np

    stacked = params["layers"]
    leaves, tree = jax.tree.flatten(stacked)
    n = leaves[0].shape[0]

    def split(x):
        if isinstance(x, jax.ShapeDtypeStruct):  # abstract (lowering): the layer's shape, its sharding less axis 0
            sh = x.sharding
            if isinstance(sh, jax.sharding.NamedSharding):
                sh = jax.sharding.NamedSharding(sh.mesh, jax.sharding.PartitionSpec(*tuple(sh.spec)[1:]))
            return [jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=sh)] * n
        devs = x.sharding.device_set if isinstance(x, jax.Array) else set()
        if len(devs) == 1 and next(iter(devs)).platform == "cpu":
            view = np.asarray(x)  # shares the buffer; device_put of an aligned view is zero-copy on CPU
            dev = jax.sharding.SingleDeviceSharding(next(iter(devs)))
            return [jax.device_put(view[i], dev) for i in range(n)]
        layers = [x[i] for i in range(n)]
        if consume and isinstance(x, jax.Array):  # the stacked buffer goes as soon as its layers exist
            jax.block_until_ready(layers)
            x.delete()
        return layers

    per_leaf = [split(x) for x in leaves]
    layers = tuple(jax.tree.unflatten(tree, [p[i] for p in per_leaf]) for i in range(n))
    return {**params, "layers": layers}
