"""Data-parallel replicas: the local devices split into N groups, each running a whole tensor-parallel `Engine`
with its own weights and KV pool, behind the interface the serving pipeline and `jaxchat.LLM` use of one engine.

Contract:
- `from_path(path, data_parallel=None, *, dtype, max_batch, max_context, quantize, mesh=None, **engine_kwargs)`:
  `data_parallel` N splits the devices (`mesh`'s, else `jax.devices()`) into N consecutive groups
  (`split_devices`); each loads the model on its own mesh (`models.load_model(path, dtype, mesh)`) and runs an
  `Engine` with `max_batch` rows and its own pool; their warm-ups (`Engine.warm_up`, each replica compiles its
  own programs) run in parallel threads. N = 1 returns a plain `Engine`. None: `default_data_parallel`
  on the model's config. A bad N (< 1, not dividing the devices, N > 1 over several processes) is a
  ValueError before anything is loaded. The choice is logged: "Plan: N data-parallel replicas of M devices".
- `default_data_parallel(kv_heads, weight_bytes, devices, platform, hbm_bytes) -> (n, why)`: 1, except on TPU
  where the kv heads do not divide the chips and the weights take at most `ONE_CHIP_SHARE` of one chip's HBM:
  then one replica per chip (attention split over chips that cannot divide its kv heads would gather every
  page across chips; a replica per chip never does). Off TPU it stays 1.
- `Replicas(engines)`: `generate(request)` and `submit(request, callback)` route each request to one replica,
  where all its deltas come from; the replica is the least loaded (`least_loaded`: fewest open requests,
  running or waiting, counted by this front from routing to the final delta; ties to the first). A request
  announced with `expect_request()` is routed when announced (the announced replica gathers the burst and
  counts it), so a burst of arrivals spreads before any reaches an engine. `abort`, `prompt_fits`,
  `warm_up` (in parallel threads), `start`, `shutdown` (`close`) go to the replicas; `stats()` sums their counts
  (`max_context`, `kv_page_size` are one replica's; `replicas` is N); `model`, `tokenizer`, `eos_token_ids` are the first replica's.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax

from jaxchat.engine.config import EngineConfig
from jaxchat.engine.engine import Engine
from jaxchat.engine.step import countdown, make_mesh
from jaxchat.engine.types import EngineStats, GenerationOutput, GenerationRequest

log = logging.getLogger(__name__)
ONE_CHIP_SHARE = 0.5  # of a chip's HBM: weights within it leave room for a pool of useful size
_ROUTE: contextvars.ContextVar[_Ticket | None] = contextvars.ContextVar("jaxchat_replica_route", default=None)
SAME_PER_REPLICA = ("max_context", "kv_page_size")  # the rest of `EngineStats` is summed


def split_devices(devices: Sequence[Any], n: int) -> list[list[Any]]:
    """`devices` in `n` consecutive groups of equal size; ValueError when `n` is below 1 or does not divide them."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"--data-parallel {n!r}: the number of replicas must be a positive integer")
    if len(devices) % n:
        raise ValueError(f"--data-parallel {n} does not divide the {len(devices)} devices "
                         f"(choose a divisor of {len(devices)})")
    size = len(devices) // n
    return [list(devices[i * size:(i + 1) * size]) for i in range(n)]


def default_data_parallel(kv_heads: int, weight_bytes: int, devices: int, platform: str,
                          hbm_bytes: int | None) -> tuple[int, str | None]:
    if platform != "tpu" or devices == 1 or kv_heads % devices == 0 or not hbm_bytes:
        return 1, None
    if weight_bytes > ONE_CHIP_SHARE * hbm_bytes:
        return 1, None
    return devices, (f"{kv_heads} kv heads do not divide {devices} chips and the weights "
                     f"({weight_bytes / (1 << 30):.2f} GiB) fit one chip: one replica per chip")


def least_loaded(loads: Sequence[int]) -> int:
    return min(range(len(loads)), key=lambda i: (loads[i], i))


def weight_bytes(config: Any, dtype: str) -> int:
    """The bytes of the model's weights in `dtype`, from its config (abstract: nothing is allocated)."""
    import numpy as np

    from jaxchat.models.families import abstract_params

    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize
               for x in jax.tree.leaves(abstract_params(config, dtype)))


def _hbm_bytes(device: Any) -> int | None:
    from jaxchat.engine.chips import chip_of_device

    chip = chip_of_device(device)
    if chip is not None:
        return chip.hbm_bytes
    stats = getattr(device, "memory_stats", lambda: None)() or {}
    return stats.get("bytes_limit")


def plan(path: str | Path, data_parallel: int | None, devices: Sequence[Any], dtype: str) -> tuple[int, str | None]:
    """(replicas, why) for serving `path` on `devices`: `data_parallel` checked, or the default."""
    if data_parallel is not None:
        split_devices(devices, data_parallel)
        if data_parallel > 1 and jax.process_count() > 1:
            raise ValueError("--data-parallel over several processes is not supported: one replica spans them all")
        return data_parallel, "asked for"
    platform = devices[0].platform
    if platform != "tpu" or len(devices) == 1 or jax.process_count() > 1:
        return 1, None
    from jaxchat.models.load import model_config, resolve_dtype

    cfg = model_config(path)
    return default_data_parallel(cfg.num_kv_heads, weight_bytes(cfg, resolve_dtype(dtype)), len(devices), platform,
                                 _hbm_bytes(devices[0]))


def from_path(path: str | Path, data_parallel: int | None = None, config: EngineConfig | None = None, *,
              mesh: jax.sharding.Mesh | None = None, **settings: Any) -> Engine | Replicas:
    """One engine over the devices, or `data_parallel` replicas (None: the default plan); `config` with
    `settings` (its fields, and `warmup`, `start`) changed."""
    warmup, start = settings.pop("warmup", True), settings.pop("start", True)
    config = (config or EngineConfig()).replace(**settings)
    devices = list(mesh.devices.flat) if mesh is not None else jax.devices()
    n, why = plan(path, data_parallel, devices, config.dtype)
    log.info("Plan: %d data-parallel replica%s of %d device%s (%s)", n, "s" * (n > 1), len(devices) // n,
             "s" * (len(devices) // n > 1), why or "the default")
    if n == 1:
        return Engine.from_path(str(path), config, mesh=mesh or make_mesh(devices), warmup=warmup, start=start)
    from jaxchat.models import load_model

    engines: list[Engine] = []
    try:
        for group in split_devices(devices, n):
            group_mesh = make_mesh(group)
            model = load_model(path, config.dtype, group_mesh, quantize=config.quantize)
            engines.append(Engine(model, config=config, mesh=group_mesh, warmup=False, start=start))
        front = Replicas(engines)
        if warmup:
            front.warm_up()
    except BaseException:
        for engine in engines:
            engine.shutdown()
        raise
    return front


@dataclasses.dataclass
class _Ticket:
    replica: int
    used: bool = False  # routed a request, or its announcement ended without one


class _Announced:
    """The arrival `Replicas.expect_request` returns: closing it closes the replica's own arrival and, if no
    request took the route, gives the replica its count back."""

    def __init__(self, replicas: Replicas, ticket: _Ticket, inner: Any) -> None:
        self._replicas, self._ticket, self._inner = replicas, ticket, inner

    def close(self) -> None:
        if self._inner is not None:
            self._inner.close()
        self._replicas._release(self._ticket)


class Replicas:
    def __init__(self, engines: Sequence[Engine]) -> None:
        if not engines:
            raise ValueError("Replicas needs at least one engine")
        self.engines = list(engines)
        first = self.engines[0]
        self.model, self.tokenizer, self.eos_token_ids = first.model, first.tokenizer, first.eos_token_ids
        self._lock = threading.Lock()
        self._open = [0] * len(self.engines)  # requests routed to each replica and not yet finished
        self._where: dict[str, int] = {}  # submitted request id -> replica (for `abort`)

    # ---- routing ------------------------------------------------------------------------------------------
    def loads(self) -> list[int]:
        with self._lock:
            return list(self._open)

    def _route(self) -> int:
        """The replica of the next request of this context: its announced one, else the least loaded (counted)."""
        with self._lock:
            ticket = _ROUTE.get()
            if ticket is not None and not ticket.used:
                ticket.used = True
                return ticket.replica
            i = least_loaded(self._open)
            self._open[i] += 1
            return i

    def _done(self, i: int) -> None:
        with self._lock:
            self._open[i] -= 1

    def _release(self, ticket: _Ticket) -> None:
        with self._lock:
            if not ticket.used:
                ticket.used = True
                self._open[ticket.replica] -= 1

    def expect_request(self) -> _Announced:
        with self._lock:
            ticket = _Ticket(least_loaded(self._open))
            self._open[ticket.replica] += 1
        _ROUTE.set(ticket)
        return _Announced(self, ticket, self.engines[ticket.replica].expect_request())

    # ---- requests -----------------------------------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        i = self._route()
        try:
            async for out in self.engines[i].generate(request):
                yield out
        finally:
            self._done(i)

    def submit(self, request: GenerationRequest, callback: Callable[[GenerationOutput], None]) -> str:
        if not request.request_id:
            request = dataclasses.replace(request, request_id=uuid.uuid4().hex)
        rid, i = request.request_id, self._route()

        def deliver(out: GenerationOutput) -> None:
            if out.finished:
                with self._lock:
                    if self._where.pop(rid, None) is not None:
                        self._open[i] -= 1
            callback(out)

        with self._lock:
            self._where[rid] = i
        try:
            return self.engines[i].submit(request, deliver)
        except BaseException:
            with self._lock:
                if self._where.pop(rid, None) is not None:
                    self._open[i] -= 1
            raise

    def abort(self, request_id: str) -> None:
        with self._lock:
            i = self._where.get(request_id)
        for engine in self.engines if i is None else [self.engines[i]]:
            engine.abort(request_id)

    def prompt_fits(self, tokens: int) -> bool:
        return all(engine.prompt_fits(tokens) for engine in self.engines)

    # ---- lifecycle and gauges -------------------------------------------------------------------------------
    def warm_up(self, lowered: Callable[[], None] | None = None) -> None:
        """Each replica compiles its own programs (bound to its devices): all at once; `lowered()` once every
        replica's are lowered or loaded (`Engine.warm_up`)."""
        each = countdown(len(self.engines), lowered)
        with ThreadPoolExecutor(len(self.engines), thread_name_prefix="jaxchat-warmup") as pool:
            list(pool.map(functools.partial(Engine.warm_up, lowered=each), self.engines))

    def start(self) -> None:
        for engine in self.engines:
            engine.start()

    def shutdown(self) -> None:
        for engine in self.engines:
            engine.shutdown()

    close = shutdown

    @property
    def stopped(self) -> bool:
        return all(engine.stopped for engine in self.engines)

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def max_context(self) -> int:
        return self.engines[0].max_context

    def stats(self) -> EngineStats:
        each = [dataclasses.asdict(engine.stats()) for engine in self.engines]
        summed = {key: sum(s[key] for s in each) for key in each[0] if key not in SAME_PER_REPLICA}
        return EngineStats(**{**summed, **{key: each[0][key] for key in SAME_PER_REPLICA}, "replicas": len(each)})
