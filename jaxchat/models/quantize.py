"""Quantising a model's params: which weights become int8, and the param tree with them replaced.

Contract: the weights quantised are exactly the params a family declares with `contract=` (`layers.param`:
the axes its matmul contracts; for stacked layers shifted past the leading layer axis); norms, biases,
routers, convolutions and gates stay float. `quantize_params(cfg, params, mesh=None)` returns the params
with each of those replaced by a `quant.Int8Weight` (per-output-channel scale) and, given a mesh, placed with
`sharding.param_partition_specs` (values as the float weight; the scale along its channels, its reduced axes
replicated). A weight that already is an `Int8Weight` is kept as it is (no re-quantisation).
`abstract_quantized(cfg, dtype)` is the quantised params' tree of ShapeDtypeStructs (orbax restores into
it).
"""

from __future__ import annotations

import functools

import jax

from jaxchat.models.config import ModelConfig
from jaxchat.models.families import abstract_model, abstract_params, as_params, is_stacked
from jaxchat.models.quant import Int8Weight, quantize_weight


def param_contracts(cfg: ModelConfig) -> dict:
    """Pure dict (params' structure) of each param's contracted axes, or None where it stays float."""
    from flax import nnx

    _, abstract = abstract_model(cfg, "float32")
    stacked = is_stacked(cfg)
    out: dict = {}
    for path, var in jax.tree_util.tree_flatten_with_path(abstract, is_leaf=lambda x: isinstance(x, nnx.Variable))[0]:
        keys = tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)
        contract = var.get_metadata().get("contract")
        if contract is not None and keys[0] == "layers" and stacked:
            contract = tuple(a + 1 for a in contract)
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = contract
    return as_params(out, cfg)


@functools.partial(jax.jit, static_argnums=1)
def _quantize(w, contract):
    return quantize_weight(w, contract)


def _walk(params, contracts, fn):
    if isinstance(params, dict):
        return {k: _walk(v, contracts[k], fn) for k, v in params.items()}
    if isinstance(params, tuple):
        return tuple(_walk(p, c, fn) for p, c in zip(params, contracts, strict=True))
    return fn(params, contracts)


def quantize_params(cfg: ModelConfig, params: dict, mesh=None) -> dict:
    contracts = param_contracts(cfg)

    def one(w, contract):
        if contract is None or isinstance(w, Int8Weight):
            return w
        return _quantize(w, contract)

    out = _walk(params, contracts, one)
    if mesh is None:
        return out
    from jaxchat.models.sharding import param_partition_specs

    specs = param_partition_specs(cfg, out, mesh)
    return jax.tree.map(lambda x, s: jax.device_put(x, jax.sharding.NamedSharding(mesh, s)), out, specs)


def abstract_quantized(cfg: ModelConfig, dtype) -> dict:
    contracts = param_contracts(cfg)
    shapes = abstract_params(cfg, dtype)
    def one(s, contract):
        if contract is None:
            return s
        scale = tuple(1 if i in contract else n for i, n in enumerate(s.shape))
        return Int8Weight(jax.ShapeDtypeStruct(s.shape, "int8"), jax.ShapeDtypeStruct(scale, "float32"),
                          jax.numpy.dtype(s.dtype).name)

    return _walk(shapes, contracts, one)
