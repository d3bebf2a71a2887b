"""The async `Engine`: one model, a fixed set of slots, a host loop in its own thread.

Contract:
- `Engine(model, max_batch=16, max_context=2048, ...)` places the params on a mesh over all local devices
  (axis "tp", `model.partition_specs(mesh)`), asks the model how to run them on the mesh's platform
  (`model.step_model(params, platform)`, a `jaxchat.models.StepModel`), hands that to the `StepRunner`
  (which allocates the batch KV cache in the model's layout), precompiles every batch,
  attention-span and prompt-length bucket (`warmup=True`) and starts the host loop thread; after that no
  request compiles. Decode attends over max_context, max_context/2 or max_context/4 positions, the
  smallest that covers every running row (`default_span_buckets`).
- `async for out in engine.generate(request)` yields `GenerationOutput` deltas for that request; the last
  has `finished=True`; deltas reach the caller's event loop once per engine step (`Mailbox`), and a step's
  first tokens right after its prefills, before its decode. Leaving
  the loop early (break, cancellation) aborts the request.
- `engine.submit(request, callback)` is the thread-level API (callback runs on the engine thread);
  `engine.abort(request_id)` frees the request's slot at the next step ("abort").
- `prefix_cache=True`: a request whose prompt starts with tokens an idle slot still holds (a finished
  turn of the same conversation) prefills only the rest (`scheduler`); off, or for models with recurrent
  layers, every prompt is prefilled whole. Greedy outputs agree either way up to float rounding (a reused
  prefix's K/V came from other programs: decode steps, another prefill length).
- `prefill_chunk`: prompts arriving while other rows decode are prefilled in chunks inside their decode steps
  (mixed steps, `scheduler`), at most that many prompt tokens per step over all the arrivals a step carries,
  for models whose forward runs them (`StepModel.mixed_steps`); 0 prefills every prompt in programs of its
  own, stalling the running rows. None (the default) is 64 on accelerators and 0 on CPU, where XLA's matmuls
  are compute-bound at these row counts (a chunk beside the decode rows costs about what its own prefill
  does) and every compiled kernel holds memory mappings a process has few of (`step.mixed_shapes`);
  `bench/mixed_steps.py` measures both side by side.
- `prefill_batches`: arrivals admitted in the same step whose prompts (what prefix reuse leaves of them) are
  short are prefilled together, up to that many per program (`StepRunner.prefill_rows`; None: 4 and 16, `()`
  prefills each alone), for the same models as mixed steps. Greedy outputs are those of separate prefills.
- Bursts: an idle engine woken by a request waits while more keep arriving, each within `burst_gap_s`
  (3 ms) of the one before, for at most `burst_window_s` (30 ms), then admits them in one step: a burst of
  parallel requests (a closed loop's next wave, an agent's fan-out) takes one batched prefill, not its first
  request alone and the rest a prefill later. A lone request waits one gap. Only with batched prefills;
  `burst_gap_s=0` turns it off. `engine.expect_request()` (the server calls it as a request comes in) announces
  a request still being read: the gather also waits while announced requests have not been submitted, within
  the window (`arrivals`).
- `jump_forward=True`: text a request's grammar forces is appended without sampling and run in one extend
  step (`scheduler`) of the prefill program; prompt-length buckets start at `min_prefill_bucket` (None: on CPU, where a
  short run costs less in a small bucket, 1 with prefix reuse and 2 with jump-forward; else 8); `executable_cache=DIR` keeps the step programs serialized there (`executables`), so
  the next engine on the same model and shapes loads them instead of tracing and compiling.
- Multi-host: `engine.relay_steps(link)` (before `start()`) makes process 0's engine send every step call to
  the follower processes first (`step_link.BroadcastRunner`); the followers build the same engine with
  `start=False` and replay them (`step_link.follow(engine.runner, ...)`). When a follower is lost the loop
  stops stepping; the requests it held fail after `CLUSTER_LOST_HOLD_S` (the server has answered them 503 by
  then, see `jaxchat serve`). A multi-process engine keeps no serialized executables.
- `engine.stats()` -> dict(running, waiting, free_slots, max_batch, max_context, steps, generated_tokens,
  prefix_cache_hit_tokens, jump_forward_tokens, mixed_steps, compile_count, compiles_after_warmup, compile_cache_hits,
  programs_loaded) for /metrics; `engine.shutdown()` stops the thread (idempotent).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxchat.engine.arrivals import Arrival, Arrivals
from jaxchat.engine.compiles import cache_hit_count, compile_count
from jaxchat.engine.executables import ExecutableStore, program_identity
from jaxchat.engine.mailbox import Mailbox
from jaxchat.engine.scheduler import Scheduler
from jaxchat.engine.step import StepRunner, default_span_buckets, make_mesh, mesh_platform, pow2_buckets
from jaxchat.engine.step_link import BroadcastRunner, ClusterLost, LeaderLink
from jaxchat.engine.types import GenerationOutput, GenerationRequest

log = logging.getLogger(__name__)
CLUSTER_LOST_HOLD_S = 2.0


DEFAULT_PREFILL_CHUNK = 64
# an idle engine woken by a request waits while more arrive, each within this gap, for at most the window
BURST_GAP_S = 0.003
BURST_WINDOW_S = 0.03


def default_min_prefill_bucket(mesh: jax.sharding.Mesh, jump_forward: bool, prefix_cache: bool = False) -> int:
    """The smallest prompt-length bucket. On CPU: 1 with prefix reuse (a prompt sent again, as a retry, a
    regenerate or a burst of one prompt, leaves one token to run: 80 ms in a 1-token program against 110 ms
    padded to 2 at batch 1 on the default model, 236 vs 283 ms for 16 such rows), else 2 with jump-forward
    (its extend steps carry a few tokens: the sampled one and the forced ones, 2-5 for a JSON key), else 8.
    XLA:CPU's matmuls cost with the rows they are given (a 2-token run 1.2x a decode step, 4 tokens 1.3x,
    8 tokens 1.5x); on TPU/GPU a small run costs what 8 tokens do, so more programs buy nothing: 8."""
    if mesh_platform(mesh) != "cpu":
        return 8
    return 1 if prefix_cache else 2 if jump_forward else 8


def default_prefill_batches(max_batch: int) -> tuple[int, ...]:
    """Row buckets for batched prefills: 4 arrivals, and up to 16 (`StepRunner.prefill_rows`)."""
    return tuple(sorted({min(4, max_batch), min(16, max_batch)} - {1}))


def default_prefill_chunk(mesh: jax.sharding.Mesh) -> int:
    """Mixed steps on accelerators (decode is bandwidth-bound there: a chunk shares the weight reads), off on
    CPU (compute-bound: see the module docstring)."""
    return 0 if mesh_platform(mesh) == "cpu" else DEFAULT_PREFILL_CHUNK


class Engine:
    def __init__(
        self,
        model: Any,
        max_batch: int = 16,
        max_context: int = 2048,
        *,
        mesh: jax.sharding.Mesh | None = None,
        batch_buckets: Sequence[int] | None = None,
        length_buckets: Sequence[int] | None = None,
        span_buckets: Sequence[int] | None = None,
        min_prefill_bucket: int | None = None,
        max_prefills_per_step: int = 4,
        prefix_cache: bool = True,
        executable_cache: str | os.PathLike | None = None,
        jump_forward: bool = True,
        prefill_chunk: int | None = None,
        prefill_batches: Sequence[int] | None = None,
        warmup: bool = True,
        start: bool = True,
        burst_gap_s: float = BURST_GAP_S,
        burst_window_s: float = BURST_WINDOW_S,
    ) -> None:
        self.model = model
        self.burst_gap_s, self.burst_window_s = burst_gap_s, burst_window_s
        self.tokenizer = model.tokenizer
        self.eos_token_ids = tuple(model.eos_token_ids)
        self.mesh = mesh if mesh is not None else (getattr(model, "mesh", None) or make_mesh())
        cfg = model.config
        vocab = cfg.vocab_size
        valid_vocab = min(vocab, len(self.tokenizer)) if self.tokenizer is not None else vocab
        specs = model.partition_specs(self.mesh)
        shardings = jax.tree.map(lambda s: NamedSharding(self.mesh, s), specs, is_leaf=lambda x: isinstance(x, P))
        params = jax.device_put(model.params, shardings)
        step_model = model.step_model(params, mesh_platform(self.mesh))
        smallest = min_prefill_bucket or default_min_prefill_bucket(self.mesh, jump_forward,
                                                                    prefix_cache and step_model.prefix_reuse)
        self.runner = StepRunner(
            step_model, max_batch, max_context, vocab, valid_vocab, self.mesh,
            batch_buckets or pow2_buckets(1, max_batch),
            length_buckets or pow2_buckets(min(smallest, max_context), max_context),
            span_buckets or default_span_buckets(max_context),
            keep_prefixes=prefix_cache,
            executables=None if executable_cache is None or jax.process_count() > 1
            else ExecutableStore(executable_cache, program_identity(model)),
            prefill_chunk=default_prefill_chunk(self.mesh) if prefill_chunk is None else prefill_chunk,
            prefill_batches=default_prefill_batches(max_batch) if prefill_batches is None else prefill_batches,
        )
        self.scheduler = Scheduler(self.runner, self.tokenizer, self.eos_token_ids, max_prefills_per_step,
                                   jump_forward=jump_forward)
        if warmup:
            self._warmup()
        self._compiles_at_ready = compile_count()
        self._mailbox = Mailbox()  # deltas for `generate` callers, flushed once per step
        self.scheduler.after_prefills = self._mailbox.flush  # and after its prefills: first tokens go out at once
        self._cv = threading.Condition()
        self.arrivals = Arrivals(self._wake)  # requests the server is still reading (`expect_request`)
        self._stopped = False
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    def _warmup(self) -> None:
        """Compile (or load from the persistent compilation cache) every bucket's program, with a progress bar
        and a log line of how many were compiled and how many loaded."""
        from tqdm import tqdm

        t0, compiles, hits = time.perf_counter(), compile_count(), cache_hit_count()
        store = self.runner.executables
        with tqdm(desc="compiling or loading programs", unit="program", leave=False) as bar:
            def progress(done: int, total: int) -> None:
                bar.total = total
                bar.update(done - bar.n)

            self.runner.warmup(progress)
        compiled, loaded = compile_count() - compiles, cache_hit_count() - hits
        deserialized = store.loaded if store is not None else 0
        log.info("Warm-up: %d programs in %.1f s (%d compiled, %d loaded from the compilation cache, %d loaded "
                 "as executables)", compiled + deserialized, time.perf_counter() - t0, compiled - loaded, loaded,
                 deserialized)

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
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="jaxchat-engine", daemon=True)
            self._thread.start()

    def relay_steps(self, link: LeaderLink) -> None:
        """Send every step call to the followers on `link` before running it (process 0 of a cluster)."""
        if self._thread is not None:
            raise RuntimeError("relay_steps must come before start()")
        self.runner = BroadcastRunner(self.runner, link)
        self.scheduler.runner = self.runner

    def shutdown(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)
        self._thread = None

    def __enter__(self) -> Engine:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _loop(self) -> None:
        sched = self.scheduler
        while True:
            with self._cv:
                idle = not sched.has_work()
                while not self._stopped and not sched.has_work():
                    self._cv.wait(timeout=0.5)
                if idle and self._gathers_bursts():
                    self._gather_burst()
                if self._stopped:
                    break
            try:
                sched.step()
            except ClusterLost as e:  # no step can run again; the server answers the open requests
                log.error("engine stopped: %s", e)
                time.sleep(CLUSTER_LOST_HOLD_S)
                sched.fail_all(f"a process of the cluster is gone: {e}")
                self._mailbox.flush()
                with self._cv:
                    self._stopped = True
                break
            except Exception as e:  # a device step failed: fail the affected requests, keep serving
                log.exception("engine step failed")
                sched.fail_all(f"engine step failed: {type(e).__name__}: {e}")
            self._mailbox.flush()
        sched.fail_all("engine shut down")
        self._mailbox.flush()

    def _gather_burst(self) -> None:
        """Woken from idle by an arrival: wait while more keep arriving (each within `burst_gap_s` of the
        last, for at most `burst_window_s` in all), so a burst is admitted in one step and prefilled in one
        batched program instead of its first request alone and the rest a prefill later. Holds `_cv`."""
        deadline = time.monotonic() + self.burst_window_s
        seen = self.scheduler.inbox_size()
        while not self._stopped and (left := deadline - time.monotonic()) > 0:
            self._cv.wait(timeout=min(self.burst_gap_s, left))
            now = self.scheduler.inbox_size()
            if now == seen and not self.arrivals.pending(self.burst_window_s):
                return
            seen = now

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    def expect_request(self) -> Arrival | None:
        """A request is on its way (the server is reading it): until it is submitted from this context (or the
        returned `Arrival` is closed), an idle engine gathering a burst waits for it (`arrivals`). None when
        this engine gathers no bursts."""
        return self.arrivals.expect() if self._gathers_bursts() else None

    def _gathers_bursts(self) -> bool:
        return self.burst_gap_s > 0 and bool(self.runner.prefill_batches)

    # ---- requests -------------------------------------------------------------------------------------
    def submit(self, request: GenerationRequest, callback: Callable[[GenerationOutput], None]) -> str:
        """Queue `request`; `callback` receives each delta on the engine thread. Returns the request id."""
        if not request.request_id:
            request = dataclasses.replace(request, request_id=uuid.uuid4().hex)
        if self._stopped:
            raise RuntimeError("engine is shut down")
        self.scheduler.submit(request, callback)
        self.arrivals.submitted()
        self._wake()
        return request.request_id

    def abort(self, request_id: str) -> None:
        self.scheduler.abort(request_id)
        self._wake()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[GenerationOutput] = asyncio.Queue()
        rid_box: list[str] = []

        def caller_gone() -> None:
            if rid_box:
                self.scheduler.abort(rid_box[0])

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

    def stats(self) -> dict[str, int]:
        s = self.scheduler
        total = compile_count()
        return {
            "running": s.n_active,
            "waiting": len(s.waiting) + len(s._inbox),
            "free_slots": len(s.slots) - s.n_active,
            "max_batch": len(s.slots),
            "max_context": self.runner.max_context,
            "steps": s.steps,
            "generated_tokens": s.generated_tokens,
            "prefix_cache_hit_tokens": s.prefix_hit_tokens,
            "jump_forward_tokens": s.forced_tokens,
            "mixed_steps": s.mixed_steps,
            "compile_count": total,
            "compiles_after_warmup": total - self._compiles_at_ready,
            "compile_cache_hits": cache_hit_count(),
            "programs_loaded": self.runner.executables.loaded if self.runner.executables is not None else 0,
        }
