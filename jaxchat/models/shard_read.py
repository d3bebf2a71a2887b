"""Reading only part of a checkpoint tensor: the block of a param that this process's devices hold.

Contract:
- `needed_box(sharding, shape)` is the smallest box (a (start, stop) per axis) covering every index of a
  param of `shape` that `sharding` places on this process's devices (all of it on one process).
- `read_block(tensor, entry, target, box)` returns `(block, nbytes)`: the entry's tensor converted to the
  param layout (`entries.convert`, into `target`, the part of the param the entry fills) and cut to `box`
  (target coordinates), and the bytes read from the file. Where the box cuts one axis of the target and that
  axis maps to a contiguous range of one axis of the checkpoint tensor (the layouts of `convert`: heads,
  transposes, fused gate/up, experts; a fused part of unit size), only that range is read (`Tensor.load_slice`);
  otherwise the whole tensor is read and the block cut from it. Either way the block equals
  `convert(tensor.load(), entry, target)[box]`.
A leaf module besides `entries` (the weight assembler imports it).
"""

from __future__ import annotations

import math

import numpy as np

from jaxchat.models.entries import Entry, convert

Box = tuple[tuple[int, int], ...]


def needed_box(sharding, shape: tuple[int, ...]) -> Box:
    lo, hi = list(shape), [0] * len(shape)
    for index in sharding.addressable_devices_indices_map(tuple(shape)).values():
        for axis, s in enumerate(index):
            start, stop, _ = s.indices(shape[axis])
            lo[axis], hi[axis] = min(lo[axis], start), max(hi[axis], stop)
    return tuple((a, b) if a < b else (0, 0) for a, b in zip(lo, hi, strict=True))


def _reshape_groups(hf_shape: tuple[int, ...], target: tuple[int, ...]) -> list[tuple[int, ...]] | None:
    """For a pure reshape, the target axes (in order) that make up each checkpoint axis (unit axes join the
    group before them)."""
    groups, axis = [], 0
    for dim in hf_shape:
        group, size = [], 1
        while axis < len(target) and size < dim:
            group.append(axis)
            size *= target[axis]
            axis += 1
        while axis < len(target) and target[axis] == 1:
            group.append(axis)
            axis += 1
        if size != dim:
            return None
        groups.append(tuple(group))
    return groups if axis == len(target) else None


def axis_groups(e: Entry, hf_shape: tuple[int, ...], target: tuple[int, ...]) -> list[tuple[int, ...]] | None:
    """The target axes making up each axis of the checkpoint tensor, in C order, or None where `convert` is not
    an axis permutation of grouped axes."""
    n = len(target)
    if e.convert == "id":
        groups = _reshape_groups(hf_shape, target)
    elif e.convert == "t":
        groups = [(n - 1 - h,) for h in range(n)]
    elif e.convert == "in_heads":  # [N*hd, D] -> [D, *heads, hd]
        groups = [tuple(range(1, n)), (0,)]
    elif e.convert == "out_heads":  # [D, H*hd] -> [H, hd, D]
        groups = [(n - 1,), tuple(range(n - 1))]
    elif e.convert == "bias_heads":
        groups = [tuple(range(n))]
    elif e.convert == "experts_t":  # [E, out, in] -> [E, in, out]
        groups = [(0,), (2,), (1,)]
    elif e.convert == "experts_gate_up":  # [E, 2F, D] -> [E, D, 2, F]
        groups = [(0,), (2, 3), (1,)]
    else:
        return None
    if groups is None or len(groups) != len(hf_shape):
        return None
    if any(math.prod(target[a] for a in g) != d for g, d in zip(groups, hf_shape, strict=True)):
        return None
    return groups


def _hf_range(e: Entry, hf_shape, target, box: Box) -> tuple[tuple[slice, ...], tuple[int, ...]] | None:
    """(the checkpoint index to read, the target shape it converts into) for a box cutting one axis."""
    cut = [i for i, (lo, hi) in enumerate(box) if (lo, hi) != (0, target[i])]
    groups = axis_groups(e, tuple(hf_shape), target) if len(cut) == 1 else None
    if groups is None:
        return None
    axis, (lo, hi) = cut[0], box[cut[0]]
    for h, group in enumerate(groups):
        if axis in group:
            j = group.index(axis)
            if any(target[a] != 1 for a in group[:j]):
                return None  # the range is strided in the checkpoint's layout
            inner = math.prod(target[a] for a in group[j + 1:])
            index = tuple(slice(lo * inner, hi * inner) if k == h else slice(None) for k in range(len(hf_shape)))
            return index, tuple(hi - lo if i == axis else d for i, d in enumerate(target))
    return None


def read_block(tensor, e: Entry, target: tuple[int, ...], box: Box) -> tuple[np.ndarray, int]:
    if all(b == (0, d) for b, d in zip(box, target, strict=True)):
        x = np.asarray(tensor.load())
        return convert(x, e, target), x.nbytes
    found = _hf_range(e, tensor.shape, target, box) if getattr(tensor, "load_slice", None) is not None else None
    if found is not None:
        index, sub_target = found
        x = np.asarray(tensor.load_slice(index))
        return convert(x, e, sub_target), x.nbytes
    x = np.asarray(tensor.load())
    return convert(x, e, target)[tuple(slice(lo, hi) for lo, hi in box)], x.nbytes
