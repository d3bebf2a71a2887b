"""How many KV pages an engine gets: sized by memory, not by max_batch x max_context.

Contract:
- `kv_bytes_per_token(model)`: the pool bytes one token takes over every layer with a KV cache of its own
  (`model.kv_dims()`: keys and values, the model dtype); KV-shared and recurrent layers take none.
- `num_pages(model, mesh, page_size, max_batch, max_context, kv_cache_gib=None)`:
  * `kv_cache_gib` given: that many GiB of pages on each device (the pool is split over the mesh's devices;
    all of it: pages beyond what the running rows need keep cached prefixes);
  * otherwise on CPU `CPU_KV_GIB` GiB or a quarter of the machine's memory, whichever is less, elsewhere (a
    device that does not report its memory) what `max_batch` rows of `max_context` tokens need; either way no
    more than that. Devices that report their memory (TPU, GPU) are planned per chip by `pool_plan` instead;
  * plus the padding page; at least one row of `max_context` must fit, or `ValueError` says what to change.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

CPU_KV_GIB = 4.0


def kv_bytes_per_token(model: Any) -> int:
    item = np.dtype(model.dtype).itemsize
    return sum(2 * kv * hd * item for kv, hd in model.kv_dims())


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 16 << 30


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
        pages = wanted
    if pages < per_row:
        raise ValueError(f"a KV pool of {pages} pages of {page_size} tokens ({per_page} bytes each) cannot hold one "
                         f"request of max_context {max_context}: give more memory (--kv-cache-gib) or a shorter "
                         f"--max-context")
    return pages + 1

