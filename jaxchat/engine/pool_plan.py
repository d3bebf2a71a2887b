"""The KV pool of an engine on devices that report their memory (TPU, GPU): sized per chip by the plan that
`jaxchat lower` prints, with the steps' temporary memory read from their compiled programs, not guessed.

Contract:
- `device_memory(mesh) -> DeviceMemory | None`: `bytes_limit` and `bytes_in_use` of the mesh's device with the
  least memory left (after the weights are placed: they are what is in use); None when a device does not say
  (XLA:CPU), and on several processes when any process's does not say; else the least over all of them.
- `least_over_processes(value)`: the least of an int over every process (the engine takes its page count so).
- `pool_bytes(new_pools, mesh, pages, stacked, pool_head_axis, padded)`: the most bytes one device holds of a
  pool of `pages` pages (`new_pools(n)` builds them), sharded as `step.StepRunner` shards it (abstract arrays:
  nothing is allocated); `padded`: each shard counted as TPU HBM lays it out (`slice_plan.chip_bytes`: a
  head_dim of 64 takes 128 lanes), else its plain bytes.
- `page_bytes(...) -> (per_page, fixed)`: one page's bytes per device, and the pool bytes per device that do not
  grow with the pages (recurrent layers' states), from two pool sizes.
- `step_temporaries(runner) -> int | None`: the most memory one step takes beyond its arguments, over the
  largest program of each kind (the most tokens and rows: ragged, decode, verify, sample): XLA's
  `memory_analysis()` of each compiled program, its temporaries plus the outputs not aliased to a donated
  argument (the logits). The programs compile through the runner's executable store, so a warm start of one
  process with a store loads them; a cold start compiles these largest programs twice (here over a one-row
  pool, then at warm-up over the planned one), a cost paid only where a device reports its memory. None when
  the platform gives no analysis (or a compile fails). They do not depend on the pool's size (the pool is donated
  and written in place; `tests/engine/test_pool_plan.py`), so a probe runner over a one-row pool measures them.
- `engine_pages(memory, model_config, step_model, shapes, page, kv_cache_gib) -> (pages, figures)`: an engine's
  pool on such devices: the temporaries measured on a probe runner of the engine's shapes, then `plan_pool`.
- `plan_pool(memory, *, temporaries, state, per_page, fixed, ...) -> slice_plan.PoolFit`: `slice_plan.fit_pages`
  on the device's own figures (`bytes_limit` as its HBM, `bytes_in_use` as the weights), the same arithmetic as
  `jaxchat lower`'s plan: `slice_plan.HEADROOM` of the memory kept back, `kv_cache_gib` GiB per device when
  given, at most `max_batch` rows of `max_context`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import astuple
from typing import Any

import jax
import numpy as np

from jaxchat.engine import slice_plan
from jaxchat.engine.program_key import ProgramKey
from jaxchat.engine.step import StepRunner, abstract, mesh_platform, pool_shardings

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    bytes_limit: int
    bytes_in_use: int


def _local_memory(mesh: Any) -> DeviceMemory | None:
    least: DeviceMemory | None = None
    for dev in mesh.devices.flat:
        if dev.process_index != jax.process_index():
            continue
        stats = dev.memory_stats() if hasattr(dev, "memory_stats") else None
        if not stats or "bytes_limit" not in stats:
            return None
        mem = DeviceMemory(int(stats["bytes_limit"]), int(stats.get("bytes_in_use", 0)))
        if least is None or mem.bytes_limit - mem.bytes_in_use < least.bytes_limit - least.bytes_in_use:
            least = mem
    return least


def device_memory(mesh: Any) -> DeviceMemory | None:
    least = _local_memory(mesh)
    if jax.process_count() == 1:
        return least
    from jax.experimental import multihost_utils  # every process takes part, whatever its own answer

    mine = np.array([least is not None, *(astuple(least) if least is not None else (0, 0))], np.int64)
    every = np.asarray(multihost_utils.process_allgather(mine)).reshape(-1, 3)
    if not every[:, 0].all():
        return None
    worst = int(np.argmin(every[:, 1] - every[:, 2]))
    return DeviceMemory(int(every[worst, 1]), int(every[worst, 2]))


def least_over_processes(value: int) -> int:
    """The least of `value` over every process (each calls it): one pool size for the whole mesh."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(np.asarray(multihost_utils.process_allgather(np.array([value], np.int64))).min())


def pool_bytes(new_pools: Callable[[int], Any], mesh: Any, pages: int, stacked: bool, pool_head_axis: int,
               padded: bool) -> int:
    """`new_pools(pages)` builds the zeroed pools (traced for their shapes only)."""
    shapes = jax.eval_shape(lambda: new_pools(pages))
    shardings = pool_shardings(shapes, mesh, 2 if stacked else 1, pages, pool_head_axis + stacked,
                               page_axis=int(stacked))
    return slice_plan.chip_bytes(abstract(shapes, shardings), padded)


def page_bytes(new_pools: Callable[[int], Any], mesh: Any, stacked: bool, pool_head_axis: int,
               padded: bool) -> tuple[float, int]:
    devices = mesh.devices.size
    one, two = (pool_bytes(new_pools, mesh, devices * k, stacked, pool_head_axis, padded) for k in (2, 4))
    per_page = (two - one) / (2 * devices)
    return per_page, max(one - int(per_page * 2 * devices), 0)


def largest_programs(keys: list[ProgramKey]) -> list[ProgramKey]:
    """One program of each kind: the one of the most tokens and rows."""
    out: dict[str, ProgramKey] = {}
    for key in keys:
        out[key.kind] = max(out.get(key.kind, key), key)
    return list(out.values())


def step_temporaries(runner: Any) -> int | None:
    most = 0
    for key in largest_programs(runner.program_keys()):
        try:
            stats = runner.compile(key).memory_analysis()
        except Exception:  # noqa: BLE001  (a platform without the analysis)
            return None
        if stats is None:
            return None
        fresh_outputs = max(int(stats.output_size_in_bytes) - int(stats.alias_size_in_bytes), 0)
        most = max(most, int(stats.temp_size_in_bytes) + fresh_outputs)
    return most


def plan_pool(memory: DeviceMemory, *, temporaries: int, state: int, per_page: float, fixed: int, page_size: int,
              max_batch: int, max_context: int, devices: int, device_name: str,
              kv_cache_gib: float | None = None) -> slice_plan.PoolFit:
    if kv_cache_gib is not None and kv_cache_gib <= 0:
        raise ValueError(f"kv_cache_gib must be positive, not {kv_cache_gib}")
    return slice_plan.fit_pages(hbm_bytes=memory.bytes_limit, weights=memory.bytes_in_use, state=state,
                                temporaries=temporaries, page_bytes=per_page, fixed=fixed, page_size=page_size,
                                max_batch=max_batch, max_context=max_context, devices=devices, chip=device_name,
                                kv_cache_gib=kv_cache_gib, devices_flag="")


def engine_pages(memory: DeviceMemory, model_config: Any, step_model: Any, shapes: dict, page: int,
                 kv_cache_gib: float | None) -> tuple[int, dict[str, Any]]:
    """(pages, the plan's figures) of an engine's pool on devices that report their memory: the steps' temporaries
    measured on a probe runner over a one-row pool (nothing allocated; estimated where the backend reports none),
    then the per-chip plan (`plan_pool`), the least over the processes; a ValueError saying what would fit when
    not even one row does. `shapes`: the `StepRunner` shapes the engine runs."""
    mesh, backend = shapes["mesh"], shapes["backend"]
    devices, padded = mesh.devices.size, mesh_platform(mesh) == "tpu"
    rows, max_context = shapes["max_batch"], shapes["max_context"]
    per_page, fixed = page_bytes(lambda n: step_model.new_pools(backend, n, page, rows), mesh,
                                 step_model.layout == "stacked", backend.pool_head_axis, padded)
    one_row = -(-(-(-max_context // page) + 1) // devices) * devices
    probe = StepRunner(step_model, num_pages=one_row, abstract_arrays=True, **shapes)
    temporaries, how = step_temporaries(probe), "measured"
    if temporaries is None:
        temporaries, how = slice_plan.step_temporaries(model_config, max(probe.token_buckets), rows, devices), "estimated"
    del probe
    state = slice_plan.state_bytes(rows, shapes["vocab_size"], padded)
    fit = plan_pool(memory, temporaries=temporaries, state=state, per_page=per_page, fixed=fixed, page_size=page,
                    max_batch=rows, max_context=max_context, devices=devices,
                    device_name=mesh.devices.flat[0].device_kind, kv_cache_gib=kv_cache_gib)
    pages = least_over_processes(fit.pages if fit.fits else 0)  # one pool for every process
    if pages == 0:
        raise ValueError(fit.message or "another process's devices cannot hold one row of max_context")
    gib = 1 << 30
    log.info("KV pool plan per device: %.2f GiB of %.2f in use after the weights, step temporaries %.2f GiB "
             "(%s), device state %.2f GiB, %.1f KiB a page", memory.bytes_in_use / gib,
             memory.bytes_limit / gib, temporaries / gib, how, state / gib, per_page / 1024)
    return pages, {"bytes_limit": memory.bytes_limit, "bytes_in_use": memory.bytes_in_use,
                   "temporaries": temporaries, "temporaries_how": how, "state": state, "page_bytes": per_page}
