"""The async `Engine`: one model, a paged KV pool, a host loop in its own thread.

Contract:
- `Engine(model, max_batch=None, max_context=None, *, config=None, mesh=None, warmup=True, start=True, **settings)`
  runs `config` (`config.EngineConfig`, every setting and its default; by default `EngineConfig()`, the settings
  `jaxchat serve` and `jaxchat.LLM()` run with) with `settings` (any of its fields) changed, resolved for the
  mesh's platform (`EngineConfig.resolve`; `engine.config`). It places the params on a mesh over all local devices
  (axis "tp", `model.partition_specs(mesh)`), asks the model how to run them on the mesh's platform
  (`model.step_model(params, platform)`, a `jaxchat.models.StepModel`), builds the KV pool and the step
  programs (`step.StepRunner`), precompiles them (`warmup=True`, or `warm_up()` later; a log line "Warm-up: N
  programs ...") and starts the host loop thread; after that no request compiles (`engine.warmup_seconds`: each
  program's key -> the seconds its compile or load took). `programs` (`program_set`; by default
  `JAXCHAT_PROGRAMS`, else "background"): "all" compiles every program at warm-up; "background" (one process
  only; "all" in a cluster) only the first set
  (`StepRunner.first_keys`: one ragged program, the largest decode step, their sampler), and the engine serves at
  once while the other programs compile on a thread ("jaxchat-compile", `wait_compiled()`), each run by the
  steps from the one after it is ready; "first" the first set and nothing more. Until a program is ready a step
  runs as chunks of a ready one (`StepRunner.selective`), so a step never waits on a compile
  (`compiles_on_request_path` stays 0). `max_batch` is the number of requests that run at once (slots);
  `max_context` is a per-request limit (prompt + output), not a reservation.
- The pool (`pages`): `page_size` tokens a page (16 on CPU and GPU; on TPU 128 to 256,
  `config.default_page_size`),
  as many pages as `kv_cache_gib` GiB per device hold; by default, on devices that report their memory
  (TPU, GPU) what each device has left after the weights, the device state, the largest steps' temporaries
  (read from their compiled programs on a probe runner, `pool_plan`) and `slice_plan.HEADROOM`, on CPU at most
  `CPU_KV_GIB` GiB (and a quarter of the machine's memory), and in either case no more than `max_batch` rows
  of `max_context` tokens need; a ValueError says what would fit when one row does not. The start-up log
  says how many tokens it holds.
- Steps: every step runs at most `max_step_tokens` tokens (512 on CPU, 2048 elsewhere; buckets of 16, 64,
  256, ... up to it, or exactly `step_token_buckets`) over at most `max_batch` rows (`scheduler`): decoding
  rows, prompt chunks, forced text; decode steps (every row one token) in `decode_rows` buckets (powers of 2
  up to `max_batch` by default).
- `async for out in engine.generate(request)` yields `GenerationOutput` deltas for that request; the last
  has `finished=True`; deltas reach the caller's event loop once per engine step (`Mailbox`). Leaving the
  loop early (break, cancellation) aborts the request.
- `engine.submit(request, callback)` is the thread-level API (callback runs on the engine thread);
  `engine.abort(request_id)` ends the request at the next step ("abort").
- `prefix_cache=True`: full pages are shared by a hash chain of their tokens (`pages`), so a prompt that
  starts with what an earlier request held (an agent's previous turn, a shared system prompt) runs only the
  rest; off, or for models with recurrent layers, every prompt runs whole. Greedy outputs agree either way up
  to float rounding (a reused page's K/V came from another step's program).
- Bursts: an idle engine woken by a request waits while more keep arriving, each within `burst_gap_s`
  (3 ms) of the one before, for at most `burst_window_s` (30 ms), then admits them in one step: a burst of
  parallel requests shares its first step instead of its first request running alone. `burst_gap_s=0`
  turns it off. `engine.expect_request()` (the server calls it as a request comes in) announces a request
  still being read: the gather also waits while announced requests have not been submitted, within the
  window (`arrivals`).
- `attention` ("auto", "xla", "pallas"; `attention_backend`): the jnp ragged attention everywhere, or JAX's
  Pallas TPU kernel ("auto" on TPU when it can run the model; off TPU under Pallas' interpreter: slow, exact),
  under shard_map over the mesh (the jnp path where the kv heads do not divide the devices). On the kernel's
  path the per-layer weight buffers replace the stacked ones (one copy: `model.params` becomes the per-layer
  form, except on one CPU device, where the layers are views of the stacked arrays).
- `speculative` ("off", "ngram", "auto", the default: `config.default_speculative`, ngram on CPU only): prompt-lookup drafts of up to `draft_tokens` tokens per row and step
  (`speculate`), verified in "verify" steps (8 tokens on CPU, 16 or 64 on accelerators; `verify_buckets`; a
  sampled token at every position) under the grammar's mask at
  every position; greedy outputs are unchanged, sampled ones keep the model's distribution.
- `overlap=True`: the host takes a step's tokens and fills the next masks while the next step's forward runs
  (`core`); False runs launch, sample and token handling in turn (the same greedy outputs).
- `jump_forward=True`: text a request's grammar forces is appended without sampling and run in the row's
  next step beside the other rows (`tokens`). `executable_cache=DIR` keeps the step programs serialized there
  (`executables`), so the next engine on the same model and shapes loads them instead of compiling; the warm-up
  records which ones it used first, and `Engine.from_path` of the same model and config loads those on a thread
  while the weights load (`executable_preload`).
- Multi-host: `engine.relay_steps(link)` (before `start()`) makes process 0's engine send every step call to
  the follower processes first (`step_link.BroadcastRunner`); the followers build the same engine with
  `start=False` and replay them (`step_link.follow(engine.runner, ...)`). When a follower is lost the loop
  stops stepping; the requests it held fail after `core.CLUSTER_LOST_HOLD_S` (the server has answered them 503 by
  then, see `jaxchat serve`). A multi-process engine keeps no serialized executables.
- Lifecycle: `shutdown()` (also `close()`, leaving a `with` block, dropping the last reference to the
  engine, and the interpreter's exit: a finaliser) stops the thread and releases the device state and compiled
  programs, then waits for a background compile in hand to end (the background stops there); idempotent.
- `engine.stats()` -> `types.EngineStats` (running, waiting, slots, steps, tokens, prefix hits, preemptions,
  drafts, pages, compiles, programs) for /metrics and /health; the compile counts are this engine's own (its
  warm-up, background and steps, `compiles.Tally`), not the process's. `engine.max_context`: the most tokens a
  request may hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import logging
import os
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxchat.engine import executable_preload, pool_plan, pool_size
from jaxchat.engine.arrivals import Arrival
from jaxchat.engine.attention_xla import XlaAttention
from jaxchat.engine.chips import chip_of_device
from jaxchat.engine.compiles import Tally
from jaxchat.engine.config import ATTENTION_CHOICES, EngineConfig
from jaxchat.engine.core import EngineCore
from jaxchat.engine.executables import ExecutableStore, program_identity, read_program
from jaxchat.engine.mailbox import Mailbox
from jaxchat.engine.plan import SchedulerShape
from jaxchat.engine.program_key import ProgramKey
from jaxchat.engine.scheduler import Scheduler
from jaxchat.engine.step import StepRunner, make_mesh, mesh_platform, pow2_buckets
from jaxchat.engine.step_link import BroadcastRunner, LeaderLink
from jaxchat.engine.types import EngineStats, GenerationOutput, GenerationRequest

log = logging.getLogger(__name__)

def token_buckets(max_step_tokens: int) -> tuple[int, ...]:
    """Token counts of the ragged programs: 16, 64, 256, ... (x4) up to `max_step_tokens`."""
    out, t = [], 16
    while t < max_step_tokens:
        out.append(t)
        t *= 4
    return (*out, max(max_step_tokens, 16))


def ragged_rows(max_batch: int) -> tuple[int, ...]:
    """Row counts of the ragged programs: 8 and max_batch (a lone row runs in the smallest: the extra rows cost
    only their logits). Models with recurrent layers run one row instead (`step.StepRunner`)."""
    return tuple(sorted({min(8, max_batch), max_batch}))


def verify_buckets(max_step_tokens: int, platform: str) -> tuple[int, ...]:
    """Token counts of the verify programs (steps with drafts), within the step budget: 8 on CPU (compute-bound
    beyond a few tokens: a step of more tokens costs more than the drafts it could add, bench/speculative.py),
    16 and 64 on accelerators (a step there reads the weights once for a few dozen tokens)."""
    sizes = (8,) if platform == "cpu" else (16, 64)
    return tuple(sorted({min(size, max_step_tokens) for size in sizes}))


INTERPRETER_ON_A_MESH = ("off TPU the kernel runs under Pallas' TPU interpreter, which hangs over several devices "
                         "when a program calls it more than once (jax 0.10.2)")


def attention_choice(name: str, config: Any, platform: str, shards: int = 1, dtype: Any = "bfloat16"
                     ) -> tuple[str, str | None]:
    """("pallas" or "xla", why not the kernel) for backend `name` ("auto", "xla", "pallas") on `platform` with the
    heads split over `shards` devices: "auto" is JAX's Pallas TPU kernel on TPU when it can run the model's
    attention there (`attention_tpu.unsupported`), else the jnp path; "pallas" falls back to the jnp path only
    where the kv heads do not divide the devices (the kernel runs per device under shard_map) and off TPU over
    several devices (`INTERPRETER_ON_A_MESH`). Raises ValueError
    for an unknown name or a model the kernel cannot run at all."""
    from jaxchat.engine import attention_tpu

    if name not in ATTENTION_CHOICES:
        raise ValueError(f"attention {name!r}: choose one of {', '.join(ATTENTION_CHOICES)}")
    if name == "xla":
        return "xla", None
    why = attention_tpu.unsupported(config, dtype, shards)
    if why is None and platform != "tpu" and shards > 1:
        why = INTERPRETER_ON_A_MESH
    if name == "auto":
        return ("pallas", None) if platform == "tpu" and why is None else ("xla", why)
    if why is not None and attention_tpu.unsupported(config, dtype, 1) is not None:
        raise ValueError(f"--attention pallas cannot run this model: {why}; use --attention xla")
    return ("xla", why) if why is not None else ("pallas", None)


def attention_backend(name: str, config: Any, platform: str, page_size: int, mesh: jax.sharding.Mesh | None = None,
                      chip: Any = None, dtype: Any = "bfloat16"):
    """The attention backend `name` asks for on `platform` (`attention_choice`; over `mesh`'s devices), with its
    step settings: the kernel (`attention_tpu.PallasAttention`, under shard_map on a mesh of several devices, its
    blocks and VMEM limit for `chip`; off TPU under Pallas' TPU interpreter: slow, exact) or the jnp path."""
    from jaxchat.engine import attention_tpu

    shards = 1 if mesh is None else mesh.devices.size
    chosen, why = attention_choice(name, config, platform, shards, dtype)
    if chosen == "xla":
        if name == "pallas":
            log.warning("attention: the jnp path instead of the Pallas kernel: %s", why)
        # on CPU: decode items of 32 positions, an iteration's keys within 1 MiB (cache-sized)
        cpu = {"decode_kv_block": max(1, 32 // page_size), "iteration_bytes": 1 << 20} if platform == "cpu" else {}
        return XlaAttention(page_size, kv_block=max(1, 128 // page_size), **cpu)
    return attention_tpu.PallasAttention(page_size, interpret=platform != "tpu", mesh=mesh if shards > 1 else None,
                                         chip=chip)


def background_order(keys: Sequence[ProgramKey]) -> list[ProgramKey]:
    """The order the background compiles go in: each forward right after its sampler (a forward is usable once
    both are), in `program_keys` order (decode steps, ragged, verify)."""
    out: list[ProgramKey] = []
    for key in keys:
        if not key.is_sampler:
            out += [k for k in (key.sampler(), key) if k not in out]
    return out + [k for k in keys if k not in out]


BACKGROUND_NICE = 19  # the background compiles' thread (and the compiler threads it starts) yield to serving
BACKGROUND_YIELD_S = 5.0  # the longest a background compile waits for the engine to be idle
# the first background compile waits this long for a quiet engine: a server's first request comes right after it
# opens, and a compile under way slows it down (its tracing holds the GIL, whatever the thread's priority: the
# default model's first tool call took 4 s beside one, 2.5 s without)
BACKGROUND_START_QUIET_S = 2.0


def in_cluster() -> bool:
    """Whether this engine is one process of several (`jax.distributed`): they must build the same programs."""
    return jax.process_count() > 1


def background_workers() -> int:
    """How many programs compile at once in the background: half the cores less one, at least one (the other
    cores are the serving threads': the engine loop, grammar masks, the server); one in a cluster of processes."""
    if in_cluster():
        return 1
    return max(1, (os.cpu_count() or 1) // 2 - 1)


def _adopter(runner: StepRunner, before: Callable[[ProgramKey], bool] | None,
             after: Callable[[ProgramKey], None] | None) -> Callable[[ProgramKey, Any], None]:
    """How a background compile hands a program over: `runner.adopt`, once `before(key)` says so (a false answer:
    never), then `after(key)`."""
    def adopt(key: ProgramKey, compiled: Any) -> None:
        if before is not None and not before(key):
            return
        runner.adopt(key, compiled)
        if after is not None:
            after(key)

    return adopt


def _compile_in_background(runner: StepRunner, keys: list[ProgramKey], tally: Tally, seconds: dict,
                           busy: Callable[[], bool] = lambda: False, workers: int = 1,
                           adopt: Callable[[ProgramKey, Any], None] | None = None) -> None:
    """Compile (or load) `keys` in their order, `workers` at once on threads, each handed to `adopt` (default
    `runner.adopt`) as it is ready (the engine thread runs it from its next step on), at the lowest CPU priority
    (`BACKGROUND_NICE`, where the OS sets it per thread), each one started when the engine is idle (`busy()` false) or has been busy for
    `BACKGROUND_YIELD_S` (so it goes on under a steady load); stops when the runner is released. A program that
    fails to compile is logged and left out (the steps keep to the others)."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    queue, lock = iter(keys), threading.Lock()

    def work(bar) -> None:
        with contextlib.suppress(OSError, AttributeError):  # Linux: this thread only, below the serving threads
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
        with tally.counting():
            _compile_queued(runner, queue, lock, busy, seconds, bar, adopt or runner.adopt)

    with tqdm(total=len(keys), desc="compiling in the background", unit="program", leave=False) as bar:
        helpers = [threading.Thread(target=work, args=(bar,), name="jaxchat-compile", daemon=True)
                   for _ in range(max(1, min(workers, len(keys))) - 1)]
        for helper in helpers:
            helper.start()
        work(bar)
        for helper in helpers:
            helper.join()
    if runner.released:
        return
    if runner.programs_ready() == len(runner.program_keys()):
        runner.selective = False  # every program is there: steps choose among all, as without a background
    log.info("Background compiles: %d programs in %.1f s; %d of %d programs ready", len(keys),
             time.perf_counter() - t0, runner.programs_ready(), len(runner.program_keys()))


def _compile_queued(runner: StepRunner, queue: Iterator[ProgramKey], lock: threading.Lock,
                    busy: Callable[[], bool], seconds: dict, bar: Any,
                    adopt: Callable[[ProgramKey, Any], None]) -> None:
    """One background worker: take the next key off the shared queue, wait for an idle engine (at most
    `BACKGROUND_YIELD_S`; its first key: idle for `BACKGROUND_START_QUIET_S`), compile it and hand it to the
    runner, until the queue is empty or the runner released."""
    first = True
    while True:
        with lock:
            key = next(queue, None)
        if key is None or runner.released:
            return
        deadline = time.monotonic() + BACKGROUND_YIELD_S
        quiet_since = time.monotonic()
        while time.monotonic() < deadline and not runner.released:
            if busy():
                quiet_since = time.monotonic()
            elif not first or time.monotonic() - quiet_since >= BACKGROUND_START_QUIET_S:
                break
            time.sleep(0.05)
        if runner.released:
            return
        if first and runner.executables is not None:  # the first set's files, kept back by the warm-up
            runner.executables.save_deferred()
        first = False
        start = time.perf_counter()
        try:
            compiled = runner.compile(key)
        except Exception:
            if not runner.released:
                log.exception("background compile of program %s failed; steps run without it", key)
            continue
        seconds[key] = time.perf_counter() - start
        adopt(key, compiled)
        bar.update(1)


def compile_workers(programs: int) -> int:
    """How many programs the warm-up compiles at once: one per core (XLA:CPU compiles one program on one core
    here: the default model's first 3, 12.3 s one after the other, 9.7 s on 2 threads), one in a cluster of
    several processes (each must build the same programs)."""
    if in_cluster():
        return 1
    return max(1, min(programs, os.cpu_count() or 1))


def _compile_with_progress(runner: StepRunner, keys: list[ProgramKey], seconds: dict, defer_saves: bool,
                           lowered: Callable[[], None] | None = None) -> None:
    """`runner.warmup(keys, lowered=lowered)` under a progress bar, `compile_workers` at once; `seconds[key]`: how
    long each took. `defer_saves`: the executable store writes their files later (`_compile_queued`, once the engine
    is quiet)."""
    from tqdm import tqdm

    store = runner.executables
    deferring = store.deferring() if defer_saves and store is not None else contextlib.nullcontext()
    with deferring, tqdm(total=len(keys), desc="compiling or loading programs", unit="program", leave=False) as bar:
        def progress(key: ProgramKey, took: float) -> None:
            seconds[key] = took
            bar.update(1)

        runner.warmup(progress, keys=keys, workers=compile_workers(len(keys)), lowered=lowered)


def _start_key(source: str, config: EngineConfig, mesh: jax.sharding.Mesh) -> str:
    """The key of an engine's start (`executable_preload.start_key`), with `config` resolved as the engine does."""
    return executable_preload.start_key(source, config.resolve(mesh_platform(mesh)), mesh.devices.flat)


def _preload_first_programs(source: str, config: EngineConfig, mesh: jax.sharding.Mesh) -> None:
    """With an executable store (one process), deserialize the programs the last start of this model and config
    loaded first on a thread, beside the weights' load (`executable_preload`); what no warm-up takes is dropped
    by the next warm-up's record."""
    if config.executable_cache is not None and not in_cluster():
        executable_preload.preload(config.executable_cache, _start_key(source, config, mesh), read_program)


class Engine:
    def __init__(self, model: Any, max_batch: int | None = None, max_context: int | None = None, *,
                 config: EngineConfig | None = None, mesh: jax.sharding.Mesh | None = None, warmup: bool = True,
                 start: bool = True, **settings: Any) -> None:
        """`config` (default `EngineConfig()`) with `settings` (any of its fields) and `max_batch` / `max_context`
        changed, resolved for the mesh's platform (`EngineConfig.resolve`: `self.config`)."""
        settings.update({k: v for k, v in (("max_batch", max_batch), ("max_context", max_context)) if v is not None})
        self.mesh = mesh if mesh is not None else (model.mesh or make_mesh())
        platform = mesh_platform(self.mesh)
        self.config = c = (config or EngineConfig()).replace(**settings).resolve(platform)
        self.model = model
        self.compiles = Tally()  # this engine's compiles (its warm-up and its steps), not the process's
        self.warmup_seconds: dict[tuple, float] = {}  # program key -> seconds to compile or load it at warm-up
        self._rest: list[ProgramKey] = []  # the programs the warm-up left to the background, until it starts
        self.tokenizer = model.tokenizer
        self.eos_token_ids = tuple(model.eos_token_ids)
        backend = attention_backend(c.attention, model.config, platform, c.page_size, self.mesh,
                                    chip_of_device(self.mesh.devices.flat[0]), model.dtype)
        step_model = self._place(model, backend, platform)
        identity = program_identity(model)
        shapes = self._shapes(model, backend, identity, platform)
        memory = pool_plan.device_memory(self.mesh) if c.num_pages is None else None
        self.pool_memory: dict[str, Any] | None = None  # the per-device plan's figures (TPU, GPU), else None
        if memory is not None:  # TPU, GPU: planned per chip, the steps' temporaries read from their programs
            pages, self.pool_memory = pool_plan.engine_pages(memory, model.config, step_model, shapes,
                                                             c.page_size, c.kv_cache_gib)
        else:
            pages = c.num_pages or pool_size.num_pages(model, self.mesh, c.page_size, c.max_batch, c.max_context,
                                                       c.kv_cache_gib)
            n_dev = self.mesh.devices.size
            if c.num_pages is None and n_dev > 1 and pages > n_dev:
                pages -= pages % n_dev  # the pages split evenly when the kv heads cannot (`step.StepRunner`)
        self.runner = StepRunner(step_model, num_pages=pages, **shapes)
        log.info("KV pool: %d pages of %d tokens (%d tokens, %.2f GiB)", pages - 1, c.page_size,
                 (pages - 1) * c.page_size, pages * c.page_size * pool_size.kv_bytes_per_token(model) / (1 << 30))
        self.scheduler = Scheduler(SchedulerShape.of(self.runner), self.tokenizer, self.eos_token_ids,
                                   jump_forward=c.jump_forward, prefix_cache=c.prefix_cache,
                                   salt=hashlib.sha256(identity.encode()).digest(), draft_tokens=c.draft_tokens)
        self._mailbox = Mailbox()  # deltas for `generate` callers, flushed once per step
        self.request_path = Tally()  # the steps' compiles alone: a step that waited on a compile (stays 0 once warm)
        self.core = EngineCore(self.scheduler, self.runner, self._mailbox, overlap=c.overlap,
                               tallies=(self.compiles, self.request_path), burst_gap_s=c.burst_gap_s,
                               burst_window_s=c.burst_window_s)
        self.arrivals = self.core.arrivals  # requests the server is still reading (`expect_request`)
        self._finalizer = weakref.finalize(self, EngineCore.shutdown, self.core)
        if warmup:
            self.warm_up()
        if start:
            self.start()

    def _place(self, model: Any, backend: Any, platform: str) -> Any:
        """The params on the mesh, as the model's `StepModel` for the backend (the Pallas kernel's per-layer
        buffers are copies, but on one CPU device views: they take the stacked arrays' place, so the weights are
        held once)."""
        specs = model.partition_specs(self.mesh)
        shardings = jax.tree.map(lambda s: NamedSharding(self.mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
        params = jax.device_put(model.params, shardings)
        takes_over = backend.name == "pallas" and model.stacked and (platform != "cpu" or self.mesh.devices.size > 1)
        step_model = (model.step_model(params, platform, layout="unrolled", consume=takes_over)
                      if backend.name == "pallas" else model.step_model(params, platform))
        if takes_over:
            model.params = step_model.params
        return step_model

    def _shapes(self, model: Any, backend: Any, identity: str, platform: str) -> dict[str, Any]:
        """The step runner's shapes and program buckets for this config."""
        c, vocab = self.config, model.config.vocab_size
        return dict(max_batch=c.max_batch, max_context=c.max_context, vocab_size=vocab,
                    valid_vocab=min(vocab, len(self.tokenizer)) if self.tokenizer is not None else vocab,
                    mesh=self.mesh, backend=backend, short_first=platform == "cpu" and c.programs == "background",
                    token_buckets=c.step_token_buckets or token_buckets(c.max_step_tokens),
                    decode_rows=c.decode_rows or pow2_buckets(1, c.max_batch), ragged_rows=ragged_rows(c.max_batch),
                    verify_buckets=verify_buckets(c.max_step_tokens, platform) if c.speculative == "ngram" else (),
                    executables=None if c.executable_cache is None or jax.process_count() > 1
                    else ExecutableStore(c.executable_cache, identity))

    def warm_up(self, lowered: Callable[[], None] | None = None) -> None:
        """Compile (or load) every step program now: what `warmup=True` does when the engine is built (an engine
        built with `warmup=False` may do it later, from any thread); its compiles count as the warm-up's. With
        `programs` "background" or "first": the first set (`StepRunner.first_keys`) now ("background": the others on
        a background thread, each run by the steps once it is ready); until a program is ready a step is chunked
        into the ready ones, never waiting on a compile (`StepRunner.selective`). `lowered()`: once they are all
        lowered or loaded (`StepRunner.warmup`)."""
        with self.compiles.counting():
            self._warmup(lowered)

    def _warmup(self, lowered: Callable[[], None] | None) -> None:
        """Compile (or load from the persistent compilation cache) the step programs, with a progress bar
        and a log line of how many were compiled and how many loaded."""
        t0, compiles, hits = time.perf_counter(), self.compiles.compiles, self.compiles.cache_hits
        store, runner = self.runner.executables, self.runner
        first_set = self.config.programs != "all" and self.core.background is None and not runner.selective
        background = first_set and self.config.programs == "background"
        keys, total = runner.first_keys() if first_set else runner.program_keys(), len(runner.program_keys())
        rest_later = background and len(keys) < total  # then the background's compile thread saves these
        _compile_with_progress(runner, keys, self.warmup_seconds, rest_later, lowered)
        if store is not None:  # the next start of this model and config loads them beside its weights
            executable_preload.record(store.directory, _start_key(self.model.source, self.config, self.mesh),
                                      store.used)
        runner.selective = runner.selective or first_set  # from now on, steps keep to the compiled programs
        compiled, loaded = self.compiles.compiles - compiles, self.compiles.cache_hits - hits
        deserialized, ahead = (store.loaded, store.ahead) if store is not None else (0, 0)
        log.info("Warm-up: %s programs in %.1f s (%d compiled, %d loaded from the compilation cache, %d loaded "
                 "as executables, %d of them ahead, beside the weights)%s", f"{len(keys)} of {total}" if first_set
                 else total, time.perf_counter() - t0, compiled - loaded, loaded, deserialized, ahead,
                 "" if len(keys) == total else "; the others compile in the background" if background
                 else "; the others are not compiled (programs: first)")
        if background and len(keys) < total:
            self._rest = [k for k in background_order(runner.program_keys()) if k not in set(keys)]
            if not in_cluster():  # a cluster's processes start theirs once linked (`compile_rest`)
                self.compile_rest()

    def compile_rest(self, before_adopt: Callable[[ProgramKey], bool] | None = None,
                     after_adopt: Callable[[ProgramKey], None] | None = None) -> None:
        """Start the background compiles of the programs the warm-up left (if any). In a cluster, process 0 adopts
        a program once `before_adopt(key)` (`LeaderLink.wait_ready`: every process has it) and a follower reports
        each it adopts (`after_adopt`: `FollowerLink.report_ready`), so every process's steps take up the same
        programs at the same step: the followers only run the programs process 0's steps name."""
        rest, self._rest = self._rest, []
        if rest:
            adopt = _adopter(self.runner, before_adopt, after_adopt)
            self.core.background = threading.Thread(
                target=_compile_in_background, name="jaxchat-compile", daemon=True,
                args=(self.runner, rest, self.compiles, self.warmup_seconds, self.core.has_work, background_workers(),
                      adopt))
            self.core.background.start()

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait until the background compiles (if any) are done; whether they are."""
        thread = self.core.background
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    @classmethod
    def from_path(cls, path: str | None = None, config: EngineConfig | None = None, *,
                  mesh: jax.sharding.Mesh | None = None, **settings: Any) -> Engine:
        """Load `path` (HF dir, .gguf, orbax dir; None = the default model asset) with the config's `dtype` and
        `quantize` (`models.load.load_model`; the first programs beside it, `_preload_first_programs`) and build an
        engine; `settings`: `Engine`'s (config fields, `warmup`, `start`)."""
        from jaxchat.assets import DEFAULT_MODEL, asset_path
        from jaxchat.models import load_model

        path = asset_path(DEFAULT_MODEL) if path is None else path
        runtime = {k: settings.pop(k) for k in ("warmup", "start") if k in settings}
        config = (config or EngineConfig()).replace(**settings)
        mesh = mesh or make_mesh()
        _preload_first_programs(str(path), config, mesh)
        model = load_model(path, config.dtype, mesh, quantize=config.quantize)
        return cls(model, config=config, mesh=mesh, **runtime)

    # ---- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        self.core.start_thread()

    def relay_steps(self, link: LeaderLink) -> None:
        """Send every step call to the followers on `link` before running it (process 0 of a cluster)."""
        if self.core.thread is not None:
            raise RuntimeError("relay_steps must come before start()")
        self.core.runner = BroadcastRunner(self.runner, link)
        self.compile_rest(before_adopt=link.wait_ready)

    def shutdown(self) -> None:
        """Stop the engine thread and release the device state and compiled programs (idempotent)."""
        self._finalizer()

    close = shutdown

    @property
    def stopped(self) -> bool:
        return self.core.stopped

    def __enter__(self) -> Engine:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def expect_request(self) -> Arrival | None:
        """A request is on its way (the server is reading it): until it is submitted from this context (or the
        returned `Arrival` is closed), an idle engine gathering a burst waits for it (`arrivals`). None when
        this engine gathers no bursts."""
        return self.arrivals.expect() if self.core.gathers_bursts() else None

    # ---- requests -------------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest, callback: Callable[[GenerationOutput], None]) -> str:
        """Queue `request`; `callback` receives each delta on the engine thread. Returns the request id."""
        if not request.request_id:
            request = dataclasses.replace(request, request_id=uuid.uuid4().hex)
        if self.core.stopped:
            raise RuntimeError("engine is shut down")
        self.scheduler.submit(request, callback)
        self.arrivals.submitted()
        self.core.wake()
        return request.request_id

    def abort(self, request_id: str) -> None:
        self.scheduler.abort(request_id)
        self.core.wake()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[GenerationOutput] = asyncio.Queue()
        rid_box: list[str] = []
        scheduler = self.scheduler

        def caller_gone() -> None:
            if rid_box:
                scheduler.abort(rid_box[0])

        def emit(out: GenerationOutput) -> None:
            self._mailbox.post(loop, functools.partial(queue.put_nowait, out), caller_gone)

        rid = self.submit(request, emit)
        rid_box.append(rid)
        finished = False
        try:
            while not finished:
                out = await queue.get()
                finished = out.finished
                yield out
        finally:
            if not finished:
                self.abort(rid)

    def prompt_fits(self, tokens: int) -> bool:
        """Whether a prompt of `tokens` tokens (and its first output) can ever be held by the KV pool."""
        pool = self.scheduler.pool
        return pool.pages_for(tokens + 1) <= pool.capacity

    @property
    def max_context(self) -> int:
        return self.config.max_context

    def stats(self) -> EngineStats:
        s, runner = self.scheduler, self.runner
        return EngineStats(
            running=len(s.running), waiting=len(s.waiting) + s.inbox_size(), free_slots=len(s.free_slots),
            max_batch=runner.max_batch, max_context=runner.max_context, steps=s.steps,
            generated_tokens=s.generated_tokens, prefix_cache_hit_tokens=s.prefix_hit_tokens,
            jump_forward_tokens=s.forced_tokens, preemptions=s.preemptions, draft_tokens=s.speculator.drafted,
            draft_accepted_tokens=s.speculator.accepted, kv_pages_used=s.pool.used(),
            kv_pages_total=s.pool.capacity, kv_page_size=s.pool.page_size, compile_count=self.compiles.compiles,
            compiles_on_request_path=self.request_path.compiles, programs_ready=runner.programs_ready(),
            programs_total=len(runner.program_keys()), compile_cache_hits=self.compiles.cache_hits,
            programs_loaded=runner.executables.loaded if runner.executables is not None else 0)
