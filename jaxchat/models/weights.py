"""Strict weight assembly: HF tensor-name tables -> the nnx param tree, with a progress bar.

Contract: a checkpoint is a mapping of HF tensor names to `Tensor(shape, load)` (shape known
before any data is read). `assemble` checks the whole mapping against the family's table first
(`families.table`, rows as in `entries`):
a tensor the table does not know (unmapped), a table entry the checkpoint lacks (missing) or a
shape that differs from the table's HF shape each raise `ModelLoadError` naming the tensor. It then
converts every tensor (HF [out, in] layout -> the params' explicit-heads layout), casts to the
target dtype, stacks layers on axis 0 (a listed family's layers stay per-layer params, rows with
`layer=None` and paths ("layers", "<i>", ...)) and places the result (with `NamedSharding`s on a mesh).
On a mesh that spans several processes (multi-host) each process reads only the blocks of each param its own
devices hold (`shard_read`: a slice of the tensor where its layout allows, `Tensor.load_slice`) and the params
are assembled as global arrays from every process's blocks. Either way it logs the bytes of tensor data read.
Its two halves are public: `host_params` (check, convert, stack into host arrays) and `place` (host arrays of every
param, e.g. the converted-weights cache's memory-mapped views, as the model's params: on CPU an aligned array of
the params' dtype becomes the device array's memory without a copy).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from jaxchat.models.config import ModelConfig, ModelLoadError
from jaxchat.models.entries import convert
from jaxchat.models.families import abstract_model, abstract_params, as_params, table
from jaxchat.models.shard_read import needed_box, read_block

log = logging.getLogger("jaxchat.models")

@dataclass(frozen=True)
class Tensor:
    shape: tuple[int, ...]
    load: Callable[[], np.ndarray]
    load_slice: Callable[[tuple[slice, ...]], np.ndarray] | None = None  # reads only tensor[index]


def check(cfg: ModelConfig, tensors: dict[str, Tensor], ignore: tuple[str, ...] = (), where: str = "") -> dict:
    """Validate names and shapes of a checkpoint against the family table; return the table."""
    tab = table(cfg, frozenset(tensors))
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

    if mesh is not None and mesh.is_multi_process:
        tab = check(cfg, tensors, ignore, where)
        graphdef, abstract = abstract_model(cfg, dtype)
        return graphdef, _assemble_local_blocks(cfg, tab, tensors, _leaf_shapes(abstract), dtype, mesh, desc)
    np_dtype = np.dtype(jax.numpy.dtype(dtype))
    return place(cfg, host_params(cfg, tensors, np_dtype, ignore, where, desc), dtype, mesh)


def host_params(cfg: ModelConfig, tensors: dict[str, Tensor], np_dtype=np.float32, ignore: tuple[str, ...] = (),
                where: str = "", desc: str = "loading") -> dict[tuple[str, ...], np.ndarray]:
    """Check, convert and stack into host arrays of `np_dtype`: param path -> array (page-aligned, `host_buffer`)."""
    from tqdm import tqdm

    tab = check(cfg, tensors, ignore, where)
    shapes = _leaf_shapes(abstract_model(cfg, "float32")[1])
    buffers = {p: host_buffer(s, np_dtype) for p, (s, _) in shapes.items()}
    filled = {p: 0 for p in shapes}
    read = 0
    for e in tab.values():
        if e.path not in buffers:
            raise ModelLoadError(f"tensor {e.hf!r} maps to unknown param {'/'.join(e.path)}")

    for e in tqdm(tab.values(), desc=desc, unit="tensor", leave=False):
        lead, target, offset = _entry_target(e, shapes[e.path][0])
        index = (*lead, *(slice(o, o + d) for o, d in zip(offset, target, strict=True)))
        raw = np.asarray(tensors[e.hf].load())
        read += raw.nbytes
        copy_into(buffers[e.path][index], convert(raw, e, target))  # cast on assignment
        filled[e.path] += int(np.prod(target))  # the table's slices of one param never overlap
    for p, n in filled.items():
        want = int(np.prod(shapes[p][0]))
        if n != want:
            raise ModelLoadError(f"param {'/'.join(p)}: the tensors fill {n} of its {want} values")
    log.info("Read %d bytes of tensor data from %s", read, where or "the checkpoint")
    return buffers


def place(cfg: ModelConfig, arrays: dict[tuple[str, ...], np.ndarray], dtype, mesh=None, where: str = ""):
    """Host arrays (param path -> array, every param of the model with its shape, e.g. `host_params`' or the
    converted-weights cache's memory-mapped views) as the model's params: (graphdef, params pure dict). An array
    of the params' dtype and 64-byte aligned becomes the device array's memory on CPU, without a copy; another
    dtype is cast first. On a mesh of several processes each process reads only its own devices' blocks. A param
    missing or of another shape raises `ModelLoadError`."""
    import jax

    graphdef, abstract = abstract_model(cfg, dtype)
    shapes = _leaf_shapes(abstract)
    src = f" in {where}" if where else ""
    for p, (shape, _) in shapes.items():
        if p not in arrays:
            raise ModelLoadError(f"param {'/'.join(p)} is missing{src}")
        if tuple(arrays[p].shape) != shape:
            raise ModelLoadError(f"param {'/'.join(p)}{src} has shape {tuple(arrays[p].shape)}, expected {shape}")
    extra = sorted("/".join(p) for p in arrays if p not in shapes)
    if extra:
        raise ModelLoadError(f"param {extra[0]}{src} is not one of the model's")
    np_dtype = np.dtype(jax.numpy.dtype(dtype))
    specs = None
    if mesh is not None:
        from jaxchat.models.sharding import param_partition_specs

        specs = param_partition_specs(cfg, abstract_params(cfg, dtype), mesh)
    params: dict = {}
    for p in list(arrays):
        buf = arrays.pop(p)  # drop the host copy as soon as it is placed
        node = params
        for k in p[:-1]:
            node = node.setdefault(k, {})
        if mesh is not None and mesh.is_multi_process:  # this process's blocks only, each cast on its own
            sharding = jax.sharding.NamedSharding(mesh, _get(specs, p))
            node[p[-1]] = jax.make_array_from_callback(buf.shape, sharding,
                                                       lambda index, buf=buf: buf[index].astype(np_dtype))
            continue
        buf = buf if buf.dtype == np_dtype else buf.astype(np_dtype)
        if mesh is None:
            node[p[-1]] = jax.device_put(buf)
        else:
            node[p[-1]] = jax.device_put(buf, jax.sharding.NamedSharding(mesh, _get(specs, p)))
    return graphdef, as_params(params, cfg)


COPY_BLOCK_BYTES = 1 << 22


def host_buffer(shape: tuple[int, ...], dtype) -> np.ndarray:
    """An uninitialised array for a param (every value is written before it is placed), page-aligned and with its
    pages mapped up front: the kernel maps them in one call instead of one fault per page during the copy, and
    on CPU `jax.device_put` takes an aligned array without copying it."""
    import mmap

    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if nbytes < mmap.PAGESIZE:
        return np.empty(shape, dtype)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
    return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), dtype).reshape(shape)


def copy_into(dest: np.ndarray, src: np.ndarray) -> None:
    """`dest[...] = src` (cast to dest's dtype); a strided `src` (a transposed view, e.g. an [out, in] weight
    read as [in, out]) is copied a few MiB at a time along its widest-strided axis, where numpy's one whole-array
    transposed copy thrashes the cache (the 0.5B's [151936, 896] embedding: 0.15 s in blocks, 1.0 s whole)."""
    if src.ndim < 2 or src.flags.c_contiguous:
        dest[...] = src
        return
    axis = int(np.argmax(np.abs(src.strides)))
    step = max(1, COPY_BLOCK_BYTES // max(1, src.nbytes // max(1, src.shape[axis])))
    for start in range(0, src.shape[axis], step):
        block = (slice(None),) * axis + (slice(start, start + step),)
        dest[block] = src[block]


def _get(tree, path: tuple[str, ...]):
    for k in path:
        tree = tree[int(k)] if isinstance(tree, tuple) else tree[k]
    return tree


def _entry_target(e, full: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(the leading param indices the entry fixes (layer, expert), the shape it fills, where that shape starts
    in the param's remaining axes)."""
    lead, target = (), full
    if e.layer is not None:
        lead, target = (e.layer,), target[1:]
    if e.expert is not None:
        lead, target = (*lead, e.expert), target[1:]
    offset = [0] * len(target)
    if e.part is not None:
        axis, start, stop = e.part
        target = (*target[:axis], stop - start, *target[axis + 1:])
        offset[axis] = start
    return lead, target, tuple(offset)


def _assemble_local_blocks(cfg, tab, tensors, shapes, dtype, mesh, desc: str) -> dict:
    """Each param as a global array built from the block this process's devices hold (`needed_box`), filled
    from the parts of the checkpoint tensors that overlap it."""
    import jax
    from tqdm import tqdm

    from jaxchat.models.sharding import param_partition_specs

    np_dtype = np.dtype(jax.numpy.dtype(dtype))
    specs = param_partition_specs(cfg, abstract_params(cfg, dtype), mesh)
    shardings = {p: jax.sharding.NamedSharding(mesh, _get(specs, p)) for p in shapes}
    boxes = {p: needed_box(shardings[p], shapes[p][0]) for p in shapes}
    blocks = {p: np.zeros(tuple(b - a for a, b in boxes[p]), np_dtype) for p in shapes}
    read = 0
    for e in tqdm(tab.values(), desc=desc, unit="tensor", leave=False):
        box = boxes[e.path]
        lead, target, offset = _entry_target(e, shapes[e.path][0])
        if any(not a <= i < b for i, (a, b) in zip(lead, box, strict=False)):
            continue  # a layer or expert this process holds nothing of
        rest = box[len(lead):]
        sub = tuple((max(a - o, 0), min(b - o, d)) for (a, b), o, d in zip(rest, offset, target, strict=True))
        if any(lo >= hi for lo, hi in sub):
            continue
        block, nbytes = read_block(tensors[e.hf], e, target, sub)
        read += nbytes
        where = tuple(i - a for i, (a, _) in zip(lead, box, strict=False)) + tuple(
            slice(o + lo - a, o + hi - a) for (lo, hi), o, (a, _) in zip(sub, offset, rest, strict=True))
        blocks[e.path][where] = block
    log.info("Read %d bytes of tensor data: this process's blocks (process %d of %d)", read, jax.process_index(),
             jax.process_count())
    params: dict = {}
    for p in list(blocks):
        block, origin = blocks.pop(p), tuple(a for a, _ in boxes[p])

        def local(index, block=block, origin=origin, shape=shapes[p][0]):
            return block[tuple(slice(s.indices(n)[0] - o, s.indices(n)[1] - o)
                               for s, o, n in zip(index, origin, shape, strict=True))]

        node = params
        for k in p[:-1]:
            node = node.setdefault(k, {})
        node[p[-1]] = jax.make_array_from_callback(shapes[p][0], shardings[p], local)
    return as_params(params, cfg)
