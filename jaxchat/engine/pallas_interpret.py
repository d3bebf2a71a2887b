"""Lets the unmodified `ragged_paged_attention` kernel run under Pallas' TPU interpret mode off TPU (slow, exact):
what `jaxchat serve --attention pallas` runs on CPU, and how the tests check the kernel path against the jnp one.

Contract: `with interpret_ragged_kernel():` patches two defects of jax 0.10.2's TPU interpreter
(`jax._src.pallas.mosaic.interpret.interpret_pallas_call`, private API) and forces TPU interpret mode; on exit
both are undone. `enable()` does the same for the rest of the process (an engine whose step programs call the
kernel: the interpreter runs inside them, long after they were traced); idempotent; `disable()` undoes it (a
process done with such engines, e.g. a test module). Anything it does not need
to change goes to the original functions untouched.
1. Loads through a ref with a reshape or bitcast transform: the interpreter's `get` turns the transform stack
   into one index range and assumes every transform is an indexer, so the kernel's `kv_ref = ...reshape(...)`
   fails with "'ReshapeTransform' object has no attribute 'indices'". The shim reads the part before the first
   such transform with the original `get` and applies the rest in numpy (bitcast as Mosaic packs sublanes).
2. Masked stores (`pltpu.store(..., mask=...)`) into a sub-view whose non-leading extent is smaller than the
   leading one: `SharedMemory.swap_buffer_content` marks out-of-bounds rows with `in_bounds_mask[n:] = False`
   on axis 0 for every axis, so an in-bounds store raises "Out-of-bounds masked swap". The shim does the masked
   store as a read (original `get`) and an unmasked swap of `where(mask, val, old)`.
Raises RuntimeError when the private functions it patches are not there (another jax): tests then skip, and the
engine refuses `--attention pallas` off TPU with that message.
"""

from __future__ import annotations

import contextlib

import numpy as np


def _modules():
    try:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc
        from jax._src.state import indexing
        from jax._src.state import types as state_types
    except ImportError as e:  # another jax layout
        raise RuntimeError(f"TPU interpreter internals not found: {e}") from e
    for owner, name in ((ipc, "get"), (ipc, "swap"), (state_types, "ReshapeTransform"),
                        (state_types, "BitcastTransform"), (indexing, "NDIndexer")):
        if not hasattr(owner, name):
            raise RuntimeError(f"TPU interpreter internals changed: no {owner.__name__}.{name}")
    if not hasattr(ipc.get, "__wrapped__"):
        raise RuntimeError("TPU interpreter internals changed: get has no __wrapped__")
    return ipc, indexing, state_types


def _as_index(s, indexing) -> slice | int:
    if isinstance(s, indexing.Slice):
        start, size, stride = int(s.start), int(s.size), int(s.stride)
        return slice(start, start + size * stride, stride)
    return int(s)


def _bitcast(arr: np.ndarray, dtype) -> np.ndarray:
    """Mosaic's ref bitcast: the second-minor dim packs (narrow -> wide) or unpacks (wide -> narrow)."""
    dtype = np.dtype(dtype)
    src, dst = arr.dtype.itemsize, dtype.itemsize
    *lead, m, n = arr.shape
    raw = arr.view(np.dtype(f"u{src}"))
    if src < dst:  # rows r*p .. r*p+p-1 become the p parts (low first) of row r
        p = dst // src
        packed = np.ascontiguousarray(raw.reshape(*lead, m // p, p, n).swapaxes(-1, -2))
        return packed.view(np.dtype(f"u{dst}")).reshape(*lead, m // p, n).view(dtype)
    if src > dst:
        p = src // dst
        parts = np.ascontiguousarray(raw).view(np.dtype(f"u{dst}")).reshape(*lead, m, n, p)
        return np.ascontiguousarray(parts.swapaxes(-1, -2)).reshape(*lead, m * p, n).view(dtype)
    return raw.view(dtype)


@contextlib.contextmanager
def interpret_ragged_kernel():
    from jax.experimental.pallas import tpu as pltpu

    ipc, indexing, state_types = _modules()
    orig_get, orig_swap = ipc.get, ipc.swap

    def get(token, device_id, local_core_id, memory_space, buffer_id, transforms, *args, **kwargs):
        transforms = tuple(transforms)
        cut = next((i for i, t in enumerate(transforms) if not isinstance(t, indexing.NDIndexer)), None)
        if cut is None:
            return orig_get(token, device_id, local_core_id, memory_space, buffer_id, transforms, *args, **kwargs)
        token, arr = orig_get(token, device_id, local_core_id, memory_space, buffer_id, transforms[:cut],
                              *args, **kwargs)
        arr = np.asarray(arr)
        for t in transforms[cut:]:
            if isinstance(t, indexing.NDIndexer):
                arr = arr[tuple(_as_index(s, indexing) for s in t.indices)]
            elif isinstance(t, state_types.ReshapeTransform):
                arr = arr.reshape(t.shape)
            elif isinstance(t, state_types.BitcastTransform):
                arr = _bitcast(arr, t.dtype)
            else:
                raise NotImplementedError(f"shim: ref transform {type(t).__name__}")
        return token, np.ascontiguousarray(arr)

    get.__wrapped__ = orig_get.__wrapped__  # the DMA path calls get.__wrapped__ with indexers only

    def swap(token, device_id, local_core_id, memory_space, buffer_id, transforms, val, mask, **kwargs):
        if mask is None:
            return orig_swap(token, device_id, local_core_id, memory_space, buffer_id, transforms, val, mask,
                             **kwargs)
        token, old = orig_get(token, device_id, local_core_id, memory_space, buffer_id, transforms)
        mask, val, old = np.asarray(mask), np.asarray(val), np.asarray(old)
        token, _ = orig_swap(token, device_id, local_core_id, memory_space, buffer_id, transforms,
                             np.where(mask, val, old), None, **kwargs)
        return token, np.where(mask, old, val)

    ipc.get, ipc.swap = get, swap
    try:
        with pltpu.force_tpu_interpret_mode():
            yield
    finally:
        ipc.get, ipc.swap = orig_get, orig_swap


_ENABLED: list = []


def enable() -> None:
    """`interpret_ragged_kernel()` entered for the rest of the process (once)."""
    if not _ENABLED:
        stack = contextlib.ExitStack()
        stack.enter_context(interpret_ragged_kernel())
        _ENABLED.append(stack)


def disable() -> None:
    """Undo `enable()` (nothing when it was not enabled)."""
    while _ENABLED:
        _ENABLED.pop().close()
