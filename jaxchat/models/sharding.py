"""Tensor-parallel partition specs by logical axes.

Contract: logical axes "heads", "kv_heads", "mlp" and "vocab" map to the mesh axis 'tp' when the
mesh has one and the dimension divides by its size; the "experts" axis of routed-expert params maps to
the mesh axis 'ep' when the mesh has one, else to 'tp' (expert parallelism on the engine's 1-D mesh;
the experts' "mlp" axis is then not split over 'tp' as well); anything else (and a non-dividing
dimension) is replicated. An int8 weight (`quant.Int8Weight`) gets the weight's spec for its values and for
its scale, whose reduced (size 1) axes are replicated, so each device holds the scales of its own channels.
The layer axis of stacked params is never sharded. The same specs serve 1 device
(a mesh without "tp", or tp = 1) and many.
and the batch over 'dp' when the mesh has such an axis.
"""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from jaxchat.models.config import ModelConfig
from jaxchat.models.families import abstract_model, as_params, is_stacked
from jaxchat.models.quant import Int8Weight

TP_AXES = ("heads", "kv_heads", "mlp", "vocab")


def _axis_size(mesh, name: str) -> int:
    return int(mesh.shape[name]) if mesh is not None and name in mesh.shape else 0


def expert_mesh_axis(mesh) -> str | None:
    """The mesh axis the "experts" logical axis shards over: 'ep' when the mesh has one, else 'tp'."""
    for name in ("ep", "tp"):
        if _axis_size(mesh, name) > 1:
            return name
    return None


def spec_for(axes: tuple[str, ...], shape: tuple[int, ...], mesh) -> P:
    """Each mesh axis shards at most one dimension: "experts" takes `expert_mesh_axis` first (expert
    parallelism), then the first dividing TP axis takes 'tp' if still free."""
    ep = expert_mesh_axis(mesh)
    out: list[str | None] = [None] * len(axes)
    used: set[str] = set()
    for i, (name, dim) in enumerate(zip(axes, shape, strict=True)):
        if name == "experts" and ep is not None and dim % _axis_size(mesh, ep) == 0:
            out[i] = ep
            used.add(ep)
    tp = _axis_size(mesh, "tp")
    for i, (name, dim) in enumerate(zip(axes, shape, strict=True)):
        if tp > 1 and "tp" not in used and name in TP_AXES and dim % tp == 0:
            out[i] = "tp"
            used.add("tp")
    return P(*out)


def param_axes(cfg: ModelConfig, dtype="float32") -> dict:
    """Pure dict (same structure as params) of logical-axis tuples, incl. the leading 'layers' axis."""
    _, abstract = abstract_model(cfg, dtype)
    stacked = is_stacked(cfg)
    out: dict = {}
    for path, var in jax.tree_util.tree_flatten_with_path(abstract, is_leaf=_is_variable)[0]:
        keys = tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
        axes = tuple(var.get_metadata().get("axes", ()))
        if keys[0] == "layers" and stacked:
            axes = ("layers", *axes)
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = axes
    return as_params(out, cfg)


def _is_variable(x) -> bool:
    from flax import nnx

    return isinstance(x, nnx.Variable)


def param_partition_specs(cfg: ModelConfig, params: dict, mesh) -> dict:
    """A pytree of PartitionSpec matching `params` (arrays or ShapeDtypeStructs)."""
    axes = param_axes(cfg)

    def walk(p, a):
        if isinstance(p, dict):
            return {k: walk(v, a[k]) for k, v in p.items()}
        if isinstance(p, tuple):  # a listed family's layers
            return tuple(walk(v, av) for v, av in zip(p, a, strict=True))
        if isinstance(p, Int8Weight):  # the scale shards with its channels (its reduced axes do not divide)
            return Int8Weight(spec_for(a, tuple(p.values.shape), mesh), spec_for(a, tuple(p.scale.shape), mesh),
                              p.dtype)
        return spec_for(a, tuple(p.shape), mesh)

    return walk(params, axes)
