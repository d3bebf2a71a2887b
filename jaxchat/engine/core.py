"""The engine core: one loop, on its own thread, that executes the scheduler's plans with the step runner.

Contract (`EngineCore(scheduler, runner, mailbox, overlap=True, tallies=(), burst_gap_s, burst_window_s)`; no
JAX here: the runner is whatever executes a step, a `step.StepRunner` in the engine, a fake in the scheduler's
tests):
- `step()` is one turn of the loop: the scheduler plans (`Scheduler.schedule`), the runner launches the plan's
  forward (`runner.launch`), the previous step's tokens are fetched and handed to the scheduler
  (`runner.fetch`, `Scheduler.update`) while that forward runs, then the plan's sampler is dispatched with the
  rows as they are now (`Scheduler.to_sample`, `runner.sample`). With `overlap=False` a step's tokens are taken
  before the next plan (launch, sample, update in turn: the same greedy outputs). Before planning, the step in
  flight is taken first when the scheduler needs it (`Scheduler.needs_tokens_first`). Each step runs inside
  every one of `tallies`' `counting()` (`compiles.Tally`: the engine's compiles, and the steps' own).
- `loop()` (the thread `start_thread()` starts): waits for work, gathers a burst of arrivals when woken from
  idle (`burst_gap_s`, `burst_window_s`, `arrivals`), steps, and flushes the mailbox once per step. A step that
  raises fails every open request and the loop goes on (`Scheduler.fail_all`); a lost cluster process
  (`step_link.ClusterLost`) stops it after `CLUSTER_LOST_HOLD_S`.
- `shutdown()` stops the thread, then releases the runner's device state and waits for the background compile in
  hand (`background`) to end; idempotent. The core holds no reference to the `Engine`, so dropping the engine
  finalises it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from jaxchat.engine.arrivals import Arrivals
from jaxchat.engine.mailbox import Mailbox
from jaxchat.engine.plan import StepLimits, StepPlan, StepResult, positions_of
from jaxchat.engine.scheduler import Scheduler
from jaxchat.engine.step_link import ClusterLost

log = logging.getLogger(__name__)
CLUSTER_LOST_HOLD_S = 2.0
BACKGROUND_JOIN_S = 300.0  # shutting down waits this long at most for the compile in hand


class EngineCore:
    def __init__(self, scheduler: Scheduler, runner: Any, mailbox: Mailbox, *, overlap: bool = True,
                 tallies: Sequence[Any] = (), burst_gap_s: float = 0.0, burst_window_s: float = 0.0) -> None:
        self.scheduler, self.runner, self.mailbox = scheduler, runner, mailbox
        self.overlap = overlap
        self.tallies = tuple(tallies)  # `compiles.Tally`s counting what the steps compile
        self.burst_gap_s, self.burst_window_s = burst_gap_s, burst_window_s
        self._inflight: StepPlan | None = None  # the sampled step whose tokens the host has not taken
        self.cv = threading.Condition()
        self.arrivals = Arrivals(self.wake)
        self.stopped = False
        self.thread: threading.Thread | None = None
        self.background: threading.Thread | None = None  # the background compiles, if any

    # ---- one step ----------------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self._inflight is not None or self.scheduler.has_work()

    def step(self) -> None:
        with contextlib.ExitStack() as counting:
            for tally in self.tallies:
                counting.enter_context(tally.counting())
            self._step()

    def _step(self) -> None:
        sched, runner = self.scheduler, self.runner
        if self._inflight is not None and sched.needs_tokens_first():
            self._take_inflight()
        plan = sched.schedule(StepLimits(runner.max_step_tokens, runner.max_step_rows, runner.max_verify_tokens))
        if plan.rows:
            plan = plan._replace(key=runner.launch(plan.inputs))
        if self._inflight is not None:
            self._take_inflight()
        if plan.rows:
            plan = sched.to_sample(plan)
            runner.sample(plan.inputs)
            self._inflight = plan
            if not self.overlap:
                self._take_inflight()

    def _take_inflight(self) -> None:
        """Fetch the step in flight's tokens (when a row sampled) and hand them to the scheduler."""
        plan, self._inflight = self._inflight, None
        result = None
        if plan.samples:
            result = StepResult(self.runner.fetch(logprobs=plan.logprobs), positions_of(plan.key, plan.inputs))
        self.scheduler.update(plan, result)

    def fail_all(self, message: str) -> None:
        """End every open request with an error (a device step itself failed); the step in flight is dropped."""
        self._inflight = None
        self.scheduler.fail_all(message)

    # ---- the thread --------------------------------------------------------------------------------------
    def wake(self) -> None:
        with self.cv:
            self.cv.notify_all()

    def gathers_bursts(self) -> bool:
        return self.burst_gap_s > 0 and self.runner.ragged_rows[-1] > 1

    def start_thread(self) -> None:
        if self.thread is None and not self.stopped:
            self.thread = threading.Thread(target=self.loop, name="jaxchat-engine", daemon=True)
            self.thread.start()

    def loop(self) -> None:
        while True:
            with self.cv:
                idle = not self.has_work()
                while not self.stopped and not self.has_work():
                    self.cv.wait(timeout=0.5)
                if idle and self.gathers_bursts():
                    self.gather_burst()
                if self.stopped:
                    break
            try:
                self.step()
            except ClusterLost as e:  # no step can run again; the server answers the open requests
                log.error("engine stopped: %s", e)
                time.sleep(CLUSTER_LOST_HOLD_S)
                self.fail_all(f"a process of the cluster is gone: {e}")
                self.mailbox.flush()
                with self.cv:
                    self.stopped = True
                break
            except Exception as e:  # a device step failed: fail the affected requests, keep serving
                log.exception("engine step failed")
                self.fail_all(f"engine step failed: {type(e).__name__}: {e}")
            self.mailbox.flush()
        self.fail_all("engine shut down")
        self.mailbox.flush()

    def gather_burst(self) -> None:
        """Woken from idle by an arrival: wait while more keep arriving (each within `burst_gap_s` of the
        last, for at most `burst_window_s` in all), so a burst is admitted in one step. Holds `cv`."""
        deadline = time.monotonic() + self.burst_window_s
        seen = self.scheduler.inbox_size()
        while not self.stopped and (left := deadline - time.monotonic()) > 0:
            self.cv.wait(timeout=min(self.burst_gap_s, left))
            now = self.scheduler.inbox_size()
            if now == seen and not self.arrivals.pending(self.burst_window_s):
                return
            seen = now

    def shutdown(self) -> None:
        """Stop the thread, then release the device state and programs (idempotent)."""
        with self.cv:
            self.stopped = True
            self.cv.notify_all()
        thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=30)
            if not thread.is_alive():
                self.thread = None
        if self.thread is None:
            self.runner.release()
            background = self.background  # it stops after the compile in hand (it sees the runner released)
            if background is not None and background is not threading.current_thread():
                background.join(timeout=BACKGROUND_JOIN_S)  # no compile left running while the process exits
