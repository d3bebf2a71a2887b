"""The async `Engine`: one model, a paged KV pool, a host loop in its own thread.

Contract:
- `Engine(model, max_batch=16, max_context=2048, ...)` places the params on a mesh over all local devices
  (axis "tp", `model.partition_specs(mesh)`), asks the model how to run them on the mesh's platform
  (`model.step_model(params, platform)`, a `jaxchat.models.StepModel`), builds the KV pool and the step
  programs (`step.StepRunner`), precompiles them (`warmup=True`, or `warm_up()` later; a log line "Warm-up: N
  programs ...") and starts the host loop thread; after that no request compiles (`engine.warmup_seconds`: each
  program's key -> the seconds its compile or load took). `programs` (`program_set`): "all" (the default here)
  compiles every program at warm-up; "background" (one process only; "all" in a cluster) only the first set
  (`StepRunner.first_keys`: one ragged program, the largest decode step, their sampler), and the engine serves at
  once while the other programs compile on a thread ("jaxchat-compile", `wait_compiled()`), each run by the
  steps from the one after it is ready; "first" the first set and nothing more. Until a program is ready a step
  runs as chunks of a ready one (`StepRunner.selective`), so a step never waits on a compile
  (`compiles_on_request_path` stays 0). `max_batch` is the number of requests that run at once (slots);
  `max_context` is a per-request limit (prompt + output), not a reservation.
- The pool (`pages`): `page_size` tokens a page (16 on CPU and GPU; on TPU 128 to 256, `default_page_size`),
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
- `speculative` ("off", "ngram", "auto": `default_speculative`, ngram on CPU only): prompt-lookup drafts of up to `draft_tokens` tokens per row and step
  (`speculate`), verified in "verify" steps (8 tokens on CPU, 16 or 64 on accelerators; `verify_buckets`; a
  sampled token at every position) under the grammar's mask at
  every position; greedy outputs are unchanged, sampled ones keep the model's distribution.
- `overlap=True`: the host takes a step's tokens and fills the next masks while the next step's forward runs
  (`core`); False runs launch, sample and token handling in turn (the same greedy outputs).
- `jump_forward=True`: text a request's grammar forces is appended without sampling and run in the row's
  next step beside the other rows (`tokens`). `executable_cache=DIR` keeps the step programs serialized there
  (`executables`), so the next engine on the same model and shapes loads them instead of compiling.
- Multi-host: `engine.relay_steps(link)` (before `start()`) makes process 0's engine send every step call to
  the follower processes first (`step_link.BroadcastRunner`); the followers build the same engine with
  `start=False` and replay them (`step_link.follow(engine.runner, ...)`). When a follower is lost the loop
  stops stepping; the requests it held fail after `core.CLUSTER_LOST_HOLD_S` (the server has answered them 503 by
  then, see `jaxchat serve`). A multi-process engine keeps no serialized executables.
- Lifecycle: `shutdown()` (also `close()`, leaving a `with` block, dropping the last reference to the
  engine, and the interpreter's exit: a finaliser) stops the thread and releases the device state and compiled
  programs, then waits for a background compile in hand to end (the background stops there); idempotent.
- `engine.stats()` -> dict(running, waiting, free_slots, max_batch, max_context, steps, generated_tokens,
  prefix_cache_hit_tokens, jump_forward_tokens, preemptions, kv_pages_used, kv_pages_total, kv_page_size,
  compile_count, compiles_after_warmup (= compiles_on_request_path: what the steps themselves compiled),
  compile_cache_hits, programs_loaded, programs_ready, programs_total) for /metrics; the compile counts are
  this engine's own (its warm-up, background and steps, `compiles.Tally`), not the process's.
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
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxchat.engine import pool_plan, pool_size, slice_plan
from jaxchat.engine.arrivals import Arrival
from jaxchat.engine.attention_xla import XlaAttention
from jaxchat.engine.chips import chip_of_device
from jaxchat.engine.compiles import Tally
from jaxchat.engine.core import EngineCore
from jaxchat.engine.executables import ExecutableStore, program_identity
from jaxchat.engine.mailbox import Mailbox
from jaxchat.engine.plan import SchedulerShape
from jaxchat.engine.program_set import check_program_set
from jaxchat.engine.scheduler import Scheduler
from jaxchat.engine.step import StepRunner, make_mesh, mesh_platform, pow2_buckets, samples_of
from jaxchat.engine.step_link import BroadcastRunner, LeaderLink
from jaxchat.engine.types import GenerationOutput, GenerationRequest

log = logging.getLogger(__name__)

# an idle engine woken by a request waits while more arrive, each within this gap, for at most the window
BURST_GAP_S = 0.003
BURST_WINDOW_S = 0.03


def default_page_size(mesh: jax.sharding.Mesh, max_context: int = 4096) -> int:
    """16 tokens on CPU and GPU; on TPU the Pallas kernel's guidance for `max_context` (128 to 256 tokens,
    `attention_tpu.page_size_for`)."""
    if mesh_platform(mesh) != "tpu":
        return 16
    from jaxchat.engine.attention_tpu import page_size_for

    return page_size_for(max_context)


def default_step_tokens(mesh: jax.sharding.Mesh) -> int:
    """The most tokens one step runs: on CPU a step's matmuls cost with its tokens, so a long prompt is cut in
    chunks of 512 (a decode step beside one waits for it); accelerators take 2048."""
    return 512 if mesh_platform(mesh) == "cpu" else 2048


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


ATTENTION_CHOICES = ("auto", "xla", "pallas")
SPECULATIVE_CHOICES = ("auto", "off", "ngram")


def default_speculative(platform: str) -> str:
    """What `speculative="auto"` runs: ngram on CPU, where bench/speculative.py shows it pays at batch 1 and costs
    nothing at 16 (docs/benchmarks.md); off on accelerators until a device run there shows the same."""
    return "ngram" if platform == "cpu" else "off"
DRAFT_TOKENS = 7  # the most tokens a row drafts per step (`drafts.DraftLength` adapts it per row)


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


def background_order(keys: Sequence[tuple]) -> list[tuple]:
    """The order the background compiles go in: each forward right after its sampler (a forward is usable once
    both are), in `program_keys` order (decode steps, ragged, verify)."""
    out: list[tuple] = []
    for key in keys:
        if key[0] == "sample":
            continue
        sampler = ("sample", samples_of(key))
        out += [k for k in (sampler, key) if k not in out]
    return out + [k for k in keys if k not in out]


BACKGROUND_NICE = 19  # the background compiles' thread (and the compiler threads it starts) yield to serving
BACKGROUND_YIELD_S = 5.0  # the longest a background compile waits for the engine to be idle


def _compile_in_background(runner: StepRunner, keys: list[tuple], tally: Tally, seconds: dict,
                           busy: Callable[[], bool] = lambda: False) -> None:
    """Compile (or load) `keys` one after the other, each adopted by the runner as it is ready (the engine thread
    runs it from its next step on), at the lowest CPU priority (`BACKGROUND_NICE`, where the OS sets it per
    thread), each one started when the engine is idle (`busy()` false) or has been busy for `BACKGROUND_YIELD_S`
    (so it goes on under a steady load); stops when the runner is released. A program that fails to compile is
    logged and left out (the steps keep to the others)."""
    from tqdm import tqdm

    with contextlib.suppress(OSError, AttributeError):  # Linux: this thread only, below the serving threads
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    t0 = time.perf_counter()
    with tally.counting(), tqdm(total=len(keys), desc="compiling in the background", unit="program",
                                leave=False) as bar:
        for key in keys:
            deadline = time.monotonic() + BACKGROUND_YIELD_S
            while busy() and time.monotonic() < deadline and not runner.released:
                time.sleep(0.05)
            if runner.released:
                return
            start = time.perf_counter()
            try:
                compiled = runner.compile(key)
            except Exception:
                if not runner.released:
                    log.exception("background compile of program %s failed; steps run without it", key)
                continue
            runner.adopt(key, compiled)
            seconds[key] = time.perf_counter() - start
            bar.update(1)
    if runner.programs_ready() == len(runner.program_keys()):
        runner.selective = False  # every program is there: steps choose among all, as without a background
    log.info("Background compiles: %d programs in %.1f s; %d of %d programs ready", len(keys),
             time.perf_counter() - t0, runner.programs_ready(), len(runner.program_keys()))


class Engine:
    def __init__(
        self,
        model: Any,
        max_batch: int = 16,
        max_context: int = 2048,
        *,
        mesh: jax.sharding.Mesh | None = None,
        page_size: int | None = None,
        kv_cache_gib: float | None = None,
        num_pages: int | None = None,
        max_step_tokens: int | None = None,
        step_token_buckets: Sequence[int] | None = None,
        decode_rows: Sequence[int] | None = None,
        prefix_cache: bool = True,
        executable_cache: str | os.PathLike | None = None,
        jump_forward: bool = True,
        overlap: bool = True,
        attention: str = "auto",
        speculative: str = "off",
        draft_tokens: int | None = None,
        warmup: bool = True,
        programs: str = "all",
        start: bool = True,
        burst_gap_s: float = BURST_GAP_S,
        burst_window_s: float = BURST_WINDOW_S,
    ) -> None:
        if decode_rows is not None and (not decode_rows or not all(1 <= r <= max_batch for r in decode_rows)):
            raise ValueError(f"decode_rows {tuple(decode_rows)}: each row count must be from 1 to max_batch ({max_batch})")
        self.model = model
        self.compiles = Tally()  # this engine's compiles (its warm-up and its steps), not the process's
        # "background": the first programs at warm-up, the others on a thread while the engine serves (one process
        # only: the processes of a cluster must run the same program at each step, so there it is "all")
        check_program_set(programs)
        self.programs = "all" if programs == "background" and jax.process_count() > 1 else programs
        self.warmup_seconds: dict[tuple, float] = {}  # program key -> seconds to compile or load it at warm-up
        self.tokenizer = model.tokenizer
        self.eos_token_ids = tuple(model.eos_token_ids)
        self.mesh = mesh if mesh is not None else (getattr(model, "mesh", None) or make_mesh())
        cfg = model.config
        vocab = cfg.vocab_size
        valid_vocab = min(vocab, len(self.tokenizer)) if self.tokenizer is not None else vocab
        specs = model.partition_specs(self.mesh)
        shardings = jax.tree.map(lambda s: NamedSharding(self.mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
        params = jax.device_put(model.params, shardings)
        if speculative not in SPECULATIVE_CHOICES:
            raise ValueError(f"speculative {speculative!r}: choose one of {', '.join(SPECULATIVE_CHOICES)}")
        if speculative == "auto":
            speculative = default_speculative(mesh_platform(self.mesh))
        page = page_size or default_page_size(self.mesh, max_context)
        backend = attention_backend(attention, model.config, mesh_platform(self.mesh), page, self.mesh,
                                    chip_of_device(self.mesh.devices.flat[0]), model.dtype)
        platform = mesh_platform(self.mesh)
        # the kernel's per-layer buffers are copies (but on one CPU device: views): they take the stacked
        # arrays' place, so the weights are held once
        takes_over = backend.name == "pallas" and model.stacked and (platform != "cpu" or self.mesh.devices.size > 1)
        step_model = (model.step_model(params, platform, layout="unrolled", consume=takes_over)
                      if backend.name == "pallas" else model.step_model(params, platform))
        if takes_over:
            model.params = step_model.params
        del params
        # no step can hold more than every row's whole context
        step_tokens = min(max_step_tokens or default_step_tokens(self.mesh), max_batch * max_context)
        identity = program_identity(model)
        shapes = dict(max_batch=max_batch, max_context=max_context, vocab_size=vocab, valid_vocab=valid_vocab,
                      mesh=self.mesh, backend=backend, token_buckets=step_token_buckets or token_buckets(step_tokens),
                      decode_rows=decode_rows or pow2_buckets(1, max_batch), ragged_rows=ragged_rows(max_batch),
                      verify_buckets=verify_buckets(step_tokens, platform) if speculative == "ngram" else (),
                      executables=None if executable_cache is None or jax.process_count() > 1
                      else ExecutableStore(executable_cache, identity))
        memory = pool_plan.device_memory(self.mesh) if num_pages is None else None
        self.pool_memory: dict[str, Any] | None = None  # the per-device plan's figures (TPU, GPU), else None
        if memory is not None:  # TPU, GPU: planned per chip, the steps' temporaries read from their programs
            pages = self._planned_pages(memory, model, step_model, shapes, page, kv_cache_gib)
        else:
            pages = num_pages or pool_size.num_pages(model, self.mesh, page, max_batch, max_context, kv_cache_gib)
            n_dev = self.mesh.devices.size
            if num_pages is None and n_dev > 1 and pages > n_dev:
                pages -= pages % n_dev  # the pages split evenly when the kv heads cannot (`step.StepRunner`)
        self.runner = StepRunner(step_model, num_pages=pages, **shapes)
        per_token = pool_size.kv_bytes_per_token(model)
        log.info("KV pool: %d pages of %d tokens (%d tokens, %.2f GiB)", pages - 1, page, (pages - 1) * page,
                 pages * page * per_token / (1 << 30))
        self.scheduler = Scheduler(SchedulerShape.of(self.runner), self.tokenizer, self.eos_token_ids,
                                   jump_forward=jump_forward, prefix_cache=prefix_cache,
                                   salt=hashlib.sha256(identity.encode()).digest(),
                                   draft_tokens=(draft_tokens or DRAFT_TOKENS) if speculative == "ngram" else 0)
        self._mailbox = Mailbox()  # deltas for `generate` callers, flushed once per step
        self.request_path = Tally()  # the steps' compiles alone: a step that waited on a compile (stays 0 once warm)
        self.core = EngineCore(self.scheduler, self.runner, self._mailbox, overlap=overlap,
                               tallies=(self.compiles, self.request_path), burst_gap_s=burst_gap_s,
                               burst_window_s=burst_window_s)
        self.arrivals = self.core.arrivals  # requests the server is still reading (`expect_request`)
        self._finalizer = weakref.finalize(self, EngineCore.shutdown, self.core)
        if warmup:
            self.warm_up()
        if start:
            self.start()

    def _planned_pages(self, memory: pool_plan.DeviceMemory, model: Any, step_model: Any, shapes: dict, page: int,
                       kv_cache_gib: float | None) -> int:
        """The pool's pages on devices that report their memory (`pool_plan`): the steps' temporaries measured
        on a probe runner over a one-row pool (nothing allocated), then the per-chip plan; a ValueError saying
        what would fit when not even one row does."""
        devices, padded = self.mesh.devices.size, mesh_platform(self.mesh) == "tpu"
        stacked = step_model.layout == "stacked"
        head_axis = getattr(shapes["backend"], "pool_head_axis", 1)
        per_page, fixed = pool_plan.page_bytes(
            lambda n: step_model.new_pools(shapes["backend"], n, page, shapes["max_batch"]), self.mesh, stacked,
            head_axis, padded)
        one_row = -(-(-(-shapes["max_context"] // page) + 1) // devices) * devices
        probe = StepRunner(step_model, num_pages=one_row, abstract_arrays=True, **shapes)
        temporaries = pool_plan.step_temporaries(probe)
        how = "measured"
        if temporaries is None:
            temporaries, how = slice_plan.step_temporaries(model.config, max(probe.token_buckets),
                                                           shapes["max_batch"], devices), "estimated"
        del probe
        rows, vocab = shapes["max_batch"], shapes["vocab_size"]
        state = slice_plan.state_bytes(rows, vocab, padded)
        fit = pool_plan.plan_pool(memory, temporaries=temporaries, state=state, per_page=per_page, fixed=fixed,
                                  page_size=page, max_batch=rows, max_context=shapes["max_context"], devices=devices,
                                  device_name=self.mesh.devices.flat[0].device_kind, kv_cache_gib=kv_cache_gib)
        pages = pool_plan.least_over_processes(fit.pages if fit.fits else 0)  # one pool for every process
        if pages == 0:
            raise ValueError(fit.message or "another process's devices cannot hold one row of max_context")
        self.pool_memory = {"bytes_limit": memory.bytes_limit, "bytes_in_use": memory.bytes_in_use,
                            "temporaries": temporaries, "temporaries_how": how, "state": state, "page_bytes": per_page}
        gib = 1 << 30
        log.info("KV pool plan per device: %.2f GiB of %.2f in use after the weights, step temporaries %.2f GiB "
                 "(%s), device state %.2f GiB, %.1f KiB a page", memory.bytes_in_use / gib,
                 memory.bytes_limit / gib, temporaries / gib, how, state / gib, per_page / 1024)
        return pages

    @property
    def burst_gap_s(self) -> float:
        return self.core.burst_gap_s

    @property
    def burst_window_s(self) -> float:
        return self.core.burst_window_s

    def warm_up(self) -> None:
        """Compile (or load) every step program now: what `warmup=True` does when the engine is built (an engine
        built with `warmup=False` may do it later, from any thread); its compiles count as the warm-up's. With
        `programs` "background" or "first": the first set (`StepRunner.first_keys`) now ("background": the others on
        a background thread, each run by the steps once it is ready); until a program is ready a step is chunked
        into the ready ones, never waiting on a compile (`StepRunner.selective`)."""
        with self.compiles.counting():
            self._warmup()

    def _warmup(self) -> None:
        """Compile (or load from the persistent compilation cache) the step programs, with a progress bar
        and a log line of how many were compiled and how many loaded."""
        from tqdm import tqdm

        t0, compiles, hits = time.perf_counter(), self.compiles.compiles, self.compiles.cache_hits
        store, runner = self.runner.executables, self.runner
        first_set = self.programs != "all" and self.core.background is None and not runner.selective
        background = first_set and self.programs == "background"
        keys = runner.first_keys() if first_set else runner.program_keys()
        last = [t0]
        with tqdm(desc="compiling or loading programs", unit="program", leave=False) as bar:
            def progress(done: int, total: int) -> None:
                now = time.perf_counter()
                self.warmup_seconds[keys[done - 1]] = now - last[0]
                last[0] = now
                bar.total = total
                bar.update(done - bar.n)

            runner.warmup(progress, keys=keys)
        runner.selective = runner.selective or first_set  # from now on, steps keep to the compiled programs
        compiled, loaded = self.compiles.compiles - compiles, self.compiles.cache_hits - hits
        deserialized = store.loaded if store is not None else 0
        total = len(runner.program_keys())
        log.info("Warm-up: %s programs in %.1f s (%d compiled, %d loaded from the compilation cache, %d loaded "
                 "as executables)%s", f"{len(keys)} of {total}" if first_set else total, time.perf_counter() - t0,
                 compiled - loaded, loaded, deserialized,
                 "" if len(keys) == total else "; the others compile in the background" if background
                 else "; the others are not compiled (programs: first)")
        if background and len(keys) < total:
            first = set(keys)
            rest = [k for k in background_order(runner.program_keys()) if k not in first]
            self.core.background = threading.Thread(target=_compile_in_background,
                                                    args=(runner, rest, self.compiles, self.warmup_seconds,
                                                          self.core.has_work),
                                                    name="jaxchat-compile", daemon=True)
            self.core.background.start()

    def wait_compiled(self, timeout: float | None = None) -> bool:
        """Wait until the background compiles (if any) are done; whether they are."""
        thread = self.core.background
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    @classmethod
    def from_path(cls, path: str | None = None, *, dtype: str = "auto", max_batch: int = 16,
                  max_context: int = 2048, quantize: str | None = None, **kwargs: Any) -> Engine:
        """Load `path` (HF dir, .gguf, orbax dir; None = the default model asset; `quantize` "int8": int8
        weights, see `models.load.load_model`) and build an engine."""
        from jaxchat.models import load_model

        if path is None:
            from jaxchat.assets import DEFAULT_MODEL, asset_path

            path = asset_path(DEFAULT_MODEL)
        mesh = kwargs.pop("mesh", None) or make_mesh()
        return cls(load_model(path, dtype, mesh, quantize=quantize), max_batch, max_context, mesh=mesh, **kwargs)

    # ---- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        self.core.start_thread()

    def relay_steps(self, link: LeaderLink) -> None:
        """Send every step call to the followers on `link` before running it (process 0 of a cluster)."""
        if self.core.thread is not None:
            raise RuntimeError("relay_steps must come before start()")
        self.runner = BroadcastRunner(self.runner, link)
        self.core.runner = self.runner

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

    def stats(self) -> dict[str, int]:
        s = self.scheduler
        total = self.compiles.compiles
        return {
            "running": len(s.running),
            "waiting": len(s.waiting) + s.inbox_size(),
            "free_slots": len(s.free_slots),
            "max_batch": self.runner.max_batch,
            "max_context": self.runner.max_context,
            "steps": s.steps,
            "generated_tokens": s.generated_tokens,
            "prefix_cache_hit_tokens": s.prefix_hit_tokens,
            "jump_forward_tokens": s.forced_tokens,
            "preemptions": s.preemptions,
            "draft_tokens": s.speculator.drafted,
            "draft_accepted_tokens": s.speculator.accepted,
            "kv_pages_used": s.pool.used(),
            "kv_pages_total": s.pool.capacity,
            "kv_page_size": s.pool.page_size,
            "compile_count": total,
            "compiles_after_warmup": self.request_path.compiles,
            "compiles_on_request_path": self.request_path.compiles,
            "programs_ready": self.runner.programs_ready(),
            "programs_total": len(self.runner.program_keys()),
            "compile_cache_hits": self.compiles.cache_hits,
            "programs_loaded": self.runner.executables.loaded if self.runner.executables is not None else 0,
        }
