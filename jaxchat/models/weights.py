"""Strict weight assembly: HF tensor-name tables -> the nnx param tree, with a progress bar.

Contract: a checkpoint is a mapping of HF tensor names to `Tensor(shape, load)` (shape known
before any data is read). `assemble` checks the whole mapping against the family's table first
(`families.table`, rows as in `entries`):
a tensor the table does not know (unmapped), a table entry the checkpoint lacks (missing) or a
shape that differs from the table's HF shape each raise `ModelLoadError` naming the tensor. It then
converts every tensor (HF [out, in] layout -> the params' explicit-heads layout), casts to the
target dtype, stacks layers on axis 0 (a listed family's layers stay per-layer params, rows with
`layer=None` and paths ("layers", "<i>", ...)) and places the result (with `NamedSharding`s on a mesh).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from jaxchat.models.config import ModelConfig, ModelLoadError
from jaxchat.models.entries import convert
from jaxchat.models.families import abstract_model, abstract_params, as_params, table


@dataclass(frozen=True)
class Tensor:
    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]


def check(cfg: ModelConfig, tensors: dict[str, Tensor], ignore: tuple[str, ...] = (), where: str = "") -> dict:
    """Validate names and shapes of a checkpoint against the family table; return the table."""
    tab = table(cfg)
    src = f" in {where}" if where else ""
    extra = sorted(n for n in tensors if n not in tab and n not in ignore)
    if extra:
        more = f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""
        raise ModelLoadError(f"unmapped tensor {extra[0]!r}{src}{more}: not part of a {cfg.family} checkpoint")
    missing = [n for n in tab if n not in tensors]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ModelLoadError(f"missing tensor {missing[0]!r}{src}{more}")
    for name, e in tab.items():
        shape = tuple(tensors[name].shape)
        if shape != e.hf_shape:
            raise ModelLoadError(f"tensor {name!r}{src} has shape {shape}, expected {e.hf_shape}")
    return tab


def _leaf_shapes(abstract_state) -> dict[tuple[str, ...], tuple]:
    import jax
    from flax import nnx

    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(abstract_state))[0]:
        out[tuple(str(k.key) for k in path)] = (tuple(leaf.shape), leaf.dtype)
    return out


def assemble(cfg: ModelConfig, tensors: dict[str, Tensor], dtype, mesh=None, ignore: tuple[str, ...] = (),
             where: str = "", desc: str = "loading"):
    """Check, convert, stack and place; returns (graphdef, params pure dict)."""
    import jax
    from tqdm import tqdm

    tab = check(cfg, tensors, ignore, where)
    graphdef, abstract = abstract_model(cfg, dtype)
    shapes = _leaf_shapes(abstract)
    np_dtype = np.dtype(jax.numpy.dtype(dtype))
    buffers = {p: np.zeros(s, np_dtype) for p, (s, _) in shapes.items()}
    filled = {p: 0 for p in shapes}
    for e in tab.values():
        if e.path not in buffers:
            raise ModelLoadError(f"tensor {e.hf!r} maps to unknown param {'/'.join(e.path)}")

    parts = Counter(e.path for e in tab.values() if e.layer in (None, 0))  # HF tensors per param (per layer)
    stacked = {e.path for e in tab.values() if e.layer is not None}  # params with a leading layer axis
    for e in tqdm(tab.values(), desc=desc, unit="tensor", leave=False):
        full = shapes[e.path][0]
        target = full[1:] if e.layer is not None else full
        index = () if e.layer is None else (e.layer,)
        if e.part is not None:
            axis, start, stop = e.part
            target = (*target[:axis], stop - start, *target[axis + 1:])
            index = (*index, *(slice(None),) * axis, slice(start, stop))
        x = convert(np.asarray(tensors[e.hf].load()), e, target)  # cast on assignment
        buffers[e.path][index if index else ...] = x
        filled[e.path] += 1
    for p, n in filled.items():
        want = (cfg.num_layers if p in stacked else 1) * max(parts[p], 1)
        if n != want:
            raise ModelLoadError(f"param {'/'.join(p)} got {n} tensors, expected {want}")
    specs = None
    if mesh is not None:
        from jaxchat.models.sharding import param_partition_specs

        specs = param_partition_specs(cfg, abstract_params(cfg, dtype), mesh)
    params: dict = {}
    for p in list(buffers):
        buf = buffers.pop(p)  # drop the host copy as soon as it is placed
        node = params
        for k in p[:-1]:
            node = node.setdefault(k, {})
        if mesh is None:
            node[p[-1]] = jax.device_put(buf)
        else:
            spec = _get(specs, p)
            node[p[-1]] = jax.device_put(buf, jax.sharding.NamedSharding(mesh, spec))
    return graphdef, as_params(params, cfg)


def _get(tree, path: tuple[str, ...]):
    for k in path:
        tree = tree[int(k)] if isinstance(tree, tuple) else tree[k]
    return tree
