"""Tensor-parallel partition specs by logical axes.

Contract: logical axes "heads", "kv_heads", "mlp" and "vocab" map to the mesh axis 'tp' when the
mesh has one and the dimension divides by its size; anything else (and a non-dividing dimension)
is replicated. The layer axis of stacked params is never sharded. The same specs serve 1 device
(a mesh without 'tp', or tp = 1) and many. The KV cache [L, B, S, KV, D] shards KV heads over 'tp'
and the batch over 'dp' when the mesh has such an axis.
"""

from __future__ import annotations

import jax
from jax.sharding import PartitionSpec as P

from jaxchat.models.config import ModelConfig
from jaxchat.models.families import abstract_model, as_params, is_stacked

TP_AXES = ("heads", "kv_heads", "mlp", "vocab")


def _axis_size(mesh, name: str) -> int:
    return int(mesh.shape[name]) if mesh is not None and name in mesh.shape else 0


def spec_for(axes: tuple[str, ...], shape: tuple[int, ...], mesh) -> P:
    tp = _axis_size(mesh, "tp")
    out, used = [], False
    for name, dim in zip(axes, shape, strict=True):
        if tp > 1 and not used and name in TP_AXES and dim % tp == 0:
            out.append("tp")
            used = True
        else:
            out.append(None)
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
        return spec_for(a, tuple(p.shape), mesh)

    return walk(params, axes)


def cache_partition_spec(cfg: ModelConfig, mesh) -> P:
    tp = _axis_size(mesh, "tp")
    dp = "dp" if _axis_size(mesh, "dp") > 1 else None
    kv = "tp" if tp > 1 and cfg.num_kv_heads % tp == 0 else None
    return P(None, dp, None, kv, None)
