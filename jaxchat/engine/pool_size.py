"""How many KV pages an engine gets: sized by memory, not by max_batch x max_context.

Contract:
- `kv_bytes_per_token(model)`: the pool bytes one token takes over every layer with a KV cache of its own
  (`model.kv_dims()`: keys and values, the model dtype); KV-shared and recurrent layers take none.
- `num_pages(model, mesh, page_size, max_batch, max_context, kv_cache_gib=None)`:
  * `kv_cache_gib` given: that many GiB of pages on each device (the pool is split over the mesh's devices;
    all of it: pages beyond what the running rows need keep cached prefixes);
  * otherwise on TPU/GPU `KV_MEMORY_FRACTION` of the memory a device has left after the weights (per
    device: the pool is split over the mesh, on its kv heads when they divide, else on its pages), on CPU `CPU_KV_GIB` GiB or a quarter
    of the machine's memory, whichever is less; either way no more than `max_batch` rows of `max_context`
    tokens need;
  * plus the padding page; at least one row of `max_context` must fit, or `ValueError` says what to change.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

CPU_KV_GIB = 4.0
KV_MEMORY_FRACTION = 0.85


def kv_bytes_per_token(model: Any) -> int:
    item = np.dtype(model.dtype).itemsize
    return sum(2 * kv * hd * item for kv, hd in model.kv_dims())


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 16 << 30


def _device_free_bytes(mesh: Any) -> int | None:
    """The least memory any device of the mesh has left, or None when the platform does not say."""
    free = []
    for dev in mesh.devices.flat:
        stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
        if not stats or "bytes_limit" not in stats:
            return None
        free.append(int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0)))
    return min(free) if free else None


def num_pages(model: Any, mesh: Any, page_size: int, max_batch: int, max_context: int,
              kv_cache_gib: float | None = None) -> int:
    per_page = max(kv_bytes_per_token(model) * page_size, 1)
    per_row = -(-max_context // page_size)
    wanted = max_batch * per_row
    platform = {d.platform for d in mesh.devices.flat}
    if kv_cache_gib is not None:
        if kv_cache_gib <= 0:
            raise ValueError(f"kv_cache_gib must be positive, not {kv_cache_gib}")
        pages = int(kv_cache_gib * (1 << 30) * mesh.devices.size // per_page)  # per device: each holds 1/n
    elif platform == {"cpu"}:
        pages = min(wanted, int(min(CPU_KV_GIB * (1 << 30), _physical_memory() / 4) // per_page))
    else:
        free = _device_free_bytes(mesh)
        shards = mesh.devices.size  # every device holds 1/n of the pool: its kv heads, else its pages (`step`)
        pages = wanted if free is None else min(wanted, int(free * KV_MEMORY_FRACTION * shards // per_page))
    if pages < per_row:
        raise ValueError(f"a KV pool of {pages} pages of {page_size} tokens ({per_page} bytes each) cannot hold one "
                         f"request of max_context {max_context}: give more memory (--kv-cache-gib) or a shorter "
                         f"--max-context")
    return pages + 1

