"""A TPU slice's memory plan: what one chip holds (weights, device state, KV pool, step temporaries) and how many
KV pages fit, from array shapes and shardings alone (abstract arrays: nothing is allocated).

Contract:
- `tpu_bytes(shape, dtype)`: the bytes an array takes in TPU HBM (an estimate of XLA's layout): its two minor
  dims padded to the tiles, the minor to 128 lanes, the second minor to 1, 2, 4 or a multiple of 8 rows of 32
  bits (bf16: two to a row, so 6 bf16 rows take 16); a 1-D array pads to 128.
- `chip_bytes(tree, padded=True)`: the most bytes any one device holds of a pytree of `jax.ShapeDtypeStruct`s
  with shardings (each array's shard shape, `tpu_bytes`; `padded=False`: its plain bytes, as a GPU holds it).
- `state_bytes(rows, vocab, padded=True)`: the device state one chip holds beside the pool (the sampler's int32
  counts and bool prompt mask, one row per slot; `padded`: a bool row takes 32 bits as TPU lays it out).
- `step_temporaries(config, tokens, rows, shards)`: an estimate of the largest step's temporaries on one chip
  (the activations of `tokens` tokens through one layer, f32, the MLP and heads split over `shards`, and the
  f32 logits of `rows` rows, three times for the sampler's work): XLA's own memory analysis needs the chip.
- `kernel_smem(rows, pages_per_row)`: the SMEM bytes of the attention kernel's scalar inputs (the page tables,
  lengths and row offsets of a step of `rows` rows, int32); `SMEM_SHARE` of the chip's SMEM is the most a plan
  gives them.
- `fit_pages(...)` -> `PoolFit`: how many pages a chip's HBM holds after weights, state and temporaries
  (`HEADROOM` of HBM kept back for the runtime), capped at `max_batch` rows of `max_context` (all of
  `kv_cache_gib` per chip when given, as far as HBM holds it); `fits` False when
  not even one row of `max_context` fits, with `message` saying by how much and what would fit (more chips, a
  shorter context, fewer rows).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import numpy as np

HEADROOM = 0.03  # of HBM, for the runtime and the compiler's own buffers beyond the estimate
SMEM_SHARE = 0.5  # of SMEM, for the kernel's page tables


def tpu_bytes(shape: tuple[int, ...], dtype: Any) -> int:
    item = np.dtype(dtype).itemsize
    dims = list(shape) or [1]
    dims[-1] = -(-dims[-1] // 128) * 128
    if len(dims) > 1:
        packing = max(1, 4 // item)
        rows = -(-dims[-2] // packing)  # 32-bit rows
        dims[-2] = (rows if rows in (1, 2, 4) else -(-rows // 8) * 8) * packing
    return int(math.prod(dims)) * item


def chip_bytes(tree: Any, padded: bool = True) -> int:
    per_device: dict[Any, int] = {}
    for x in jax.tree.leaves(tree):
        sharding = x.sharding
        shard = sharding.shard_shape(x.shape)
        size = tpu_bytes(shard, x.dtype) if padded else math.prod(shard) * np.dtype(x.dtype).itemsize
        for dev in sharding.device_set:
            per_device[dev] = per_device.get(dev, 0) + size
    return max(per_device.values(), default=0)


def state_bytes(rows: int, vocab: int, padded: bool = True) -> int:
    return 2 * tpu_bytes((rows, vocab), np.int32) if padded else 5 * rows * vocab


def step_temporaries(config: Any, tokens: int, rows: int, shards: int) -> int:
    inter = max(config.intermediate_size, config.moe_intermediate_size * max(config.num_experts_per_tok, 1))
    heads = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    per_token = 6 * config.hidden_size + (3 * inter + 2 * heads) // max(shards, 1)
    return 4 * tokens * per_token + 3 * 4 * rows * config.vocab_size


def kernel_smem(rows: int, pages_per_row: int) -> int:
    return 4 * (rows * (pages_per_row + 2) + 1 + 3)


@dataclasses.dataclass(frozen=True)
class PoolFit:
    pages: int  # pages of the pool, the padding page included (0: does not fit)
    wanted: int  # pages max_batch rows of max_context would need (padding page included)
    free_bytes: int  # HBM per chip left for the pool
    page_bytes: float  # pool bytes per chip per page
    fits: bool
    message: str


def fit_pages(*, hbm_bytes: int, weights: int, state: int, temporaries: int, page_bytes: float, fixed: int,
              page_size: int, max_batch: int, max_context: int, devices: int, chip: str,
              kv_cache_gib: float | None = None, devices_flag: str = "--devices") -> PoolFit:
    """`page_bytes` per page per chip, `fixed` pool bytes per chip that do not grow with pages (recurrent
    states); `kv_cache_gib` per chip instead of what is left; `devices_flag` ("": none) is named beside the
    chip count that would hold the model."""
    per_row = -(-max_context // page_size)
    wanted = -(-(max_batch * per_row + 1) // devices) * devices  # the pages split evenly over the devices
    reserve = int(HEADROOM * hbm_bytes)
    free = hbm_bytes - weights - state - temporaries - fixed - reserve
    budget = free if kv_cache_gib is None else min(free, int(kv_cache_gib * (1 << 30)))
    if page_bytes <= 0:
        pages = wanted
    else:  # all of `kv_cache_gib` when given: pages beyond the rows' need keep cached prefixes
        pages = int(budget // page_bytes) if kv_cache_gib is not None else min(wanted, int(budget // page_bytes))
    pages -= pages % devices if pages > devices else 0
    if pages >= per_row + 1:
        return PoolFit(pages, wanted, free, page_bytes, True, "")
    gib = 1 << 30
    if kv_cache_gib is not None and budget < free:  # the flag, not the chip, is too small
        return PoolFit(max(pages, 0), wanted, free, page_bytes, False, (
            f"--kv-cache-gib {kv_cache_gib:g} holds {max(pages, 0)} pages of {page_size} tokens per chip; one row "
            f"of {max_context} tokens needs {per_row + 1}: give more --kv-cache-gib (the chip has "
            f"{free / gib:.2f} GiB left for the pool) or a shorter --max-context"))
    need = weights + state + temporaries + fixed + reserve + (per_row + 1) * page_bytes
    over = need - hbm_bytes
    parts = [f"does not fit {devices} x {chip} ({hbm_bytes / gib:.1f} GiB HBM per chip): weights "
             f"{weights / gib:.2f} GiB, device state {state / gib:.2f} GiB, step temporaries "
             f"{temporaries / gib:.2f} GiB, one row of {max_context} tokens {(per_row + 1) * page_bytes / gib:.2f}"
             f" GiB per chip: {over / gib:.2f} GiB over"]
    context = int(max(free, 0) // page_bytes - 1) * page_size if page_bytes > 0 else 0
    if context >= page_size:
        parts.append(f"a context of at most {context} tokens fits (--max-context)")
    moving = weights + temporaries + fixed + (per_row + 1) * page_bytes  # what more chips would split
    for more in (2, 4, 8, 16, 32, 64):
        if devices * more <= 256 and moving / more + state + reserve <= hbm_bytes:
            flag = f" ({devices_flag} {devices * more})" if devices_flag else " (a larger slice)"
            parts.append(f"about {devices * more} chips would hold it{flag}")
            break
    return PoolFit(max(pages, 0), wanted, free, page_bytes, False, "; ".join(parts))
