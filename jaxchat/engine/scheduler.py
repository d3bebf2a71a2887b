"""Continuous batching over a paged KV pool: what each step runs, decided on the host.

Contract:
- `Scheduler.submit(request, emit)` queues a request; `emit(GenerationOutput)` is called (from the thread
  that calls `step()`) with each delta, the last one having `finished=True` and a `finish_reason`.
- `step()`: apply aborts, `schedule()` a `StepPlan`, run it, and hand each row's outputs to the token handler
  (`tokens.TokenHandler`); then free what finished requests held.
- Overlap (`overlap=True`, the engine's default): a step's forward is launched before the previous step's
  sampled tokens are read (`runner.launch`); while it runs, the host takes those tokens (grammar accept,
  detokenise, stop checks, emit) and fills the next masks, then dispatches this step's sampler
  (`runner.sample`) with them. A row whose token is still on the device is scheduled with that token fed from
  the device (`RowInput.feed`), unless that token will be its last (`max_tokens`, the context). A row found
  finished when its token is taken has its sample in the running step dropped (one extra token computed,
  never emitted); a row whose token brings forced text (jump-forward) drops it too and runs the forced tokens
  in the next step. Greedy outputs are those of `overlap=False` (launch, sample, take in turn).
- `schedule()` (the decisions; the runner only executes): within one step's token budget
  (`runner.max_step_tokens`) and rows (`runner.max_step_rows`: both those of the programs compiled so far
  while the rest compile in the background, so a long prompt runs in chunks of a ready program) it takes
  every running request's pending tokens, oldest first (one token while decoding, the sampled token and forced
  text after a jump, the next chunk of a prompt), then admits waiting requests in arrival order while a slot,
  budget and the pages of the whole prompt can be had; each row's page table is extended to cover what it runs.
  A row samples when the step runs its last pending token.
  Models with recurrent layers get uniform steps only: one row's chunk alone, or every row one token.
- Pages (`pages.PagePool`): a request holds the pages of its tokens; full pages whose K/V are written are
  keyed in the prefix cache after each step (`--no-prefix-cache` keys nothing; models with recurrent layers
  never share). Admission maps the longest cached run of full pages of the prompt into the request's table
  (at least the last prompt token is run: its logits give the first output; a request with a repetition
  penalty reuses nothing, one with presence/frequency penalties only prompt pages) and counts them in
  `num_cached_tokens` / `prefix_hit_tokens`.
- Pressure: when a running row needs a page and none can be had (free or evictable), the newest request is
  preempted: its pages released (their full pages stay cached), its slot freed, and it goes back to the front
  of the queue; when admitted again its prompt and outputs are recomputed (a prefill like any other) and it
  goes on sampling from where it was, its grammar, detokeniser and sampling steps untouched, so greedy output
  is what it would have been. A request that alone needs more pages than the pool has ends with "length"
  (or, if its prompt never fits, "error").
- Per row: its own constraint (None = all-ones mask, no host work), sampling parameters and stop conditions
  (see `tokens`). An exception raised while handling one request ends that request with finish_reason
  "error"; the other requests continue. `fail_all` ends everything (a device step itself failed) and forgets
  the prefix cache.
"""

from __future__ import annotations

import collections
import itertools
import os
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from jaxchat.engine.compiles import Tally
from jaxchat.engine.pages import PagePool
from jaxchat.engine.sequence import Sequence
from jaxchat.engine.speculate import Speculator
from jaxchat.engine.step import RowInput, StepRunner
from jaxchat.engine.tokenizer import IncrementalDetokenizer, StopStringMatcher
from jaxchat.engine.tokens import TokenHandler
from jaxchat.engine.types import GenerationOutput, GenerationRequest

Emit = Callable[[GenerationOutput], None]


class PlannedRow(NamedTuple):
    seq: Sequence
    input: RowInput
    epoch: int = 0  # the request's epoch when planned (a preemption since makes the row stale)


class StepPlan(NamedTuple):
    """What one step runs: its rows in order (each a request and its `RowInput`)."""

    rows: list[PlannedRow]
    key: tuple = ()  # the forward program it ran (set at launch)

    @property
    def tokens(self) -> int:
        return sum(len(row.input.tokens) for row in self.rows)


class Scheduler:
    def __init__(self, runner: Any, tokenizer: Any, eos_token_ids: tuple[int, ...] = (), jump_forward: bool = True,
                 prefix_cache: bool = True, salt: bytes = b"", overlap: bool = False, draft_tokens: int = 0,
                 compiles: Tally | None = None) -> None:
        self.runner = runner
        self.compiles = compiles or Tally()  # what the steps compile, whichever thread runs them
        self.request_path = Tally()  # the steps' compiles alone: a step that waited on a compile (stays 0 once warm)
        self.speculator = Speculator(draft_tokens, getattr(runner, "max_verify_tokens", 0), runner.max_context,
                                     runner.mask_words)
        self.overlap = overlap
        self._inflight: StepPlan | None = None  # the sampled step whose tokens the host has not taken
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(eos_token_ids)
        self.pool = PagePool(runner.num_pages, runner.page_size, prefix_cache and runner.prefix_reuse, salt)
        self.tokens = TokenHandler(tokenizer, runner.max_context, jump_forward=jump_forward)
        self.free_slots = list(range(runner.max_batch))[::-1]  # pop() gives the lowest slot
        self.running: list[Sequence] = []  # admission order
        self.waiting: collections.deque[Sequence] = collections.deque()
        self._inbox: collections.deque[Sequence] = collections.deque()
        self._aborts: collections.deque[str] = collections.deque()
        self._lock = threading.Lock()
        self._arrivals = itertools.count()
        self.steps = 0
        self.prefix_hit_tokens = 0
        self.preemptions = 0

    # ---- thread-safe entry points -----------------------------------------------------------------
    def submit(self, request: GenerationRequest, emit: Emit) -> None:
        s = request.sampling
        stop_ids = set(s.stop_token_ids) | (set() if s.ignore_eos else set(self.eos_ids))
        seq = Sequence(request, emit, frozenset(stop_ids), next(self._arrivals),
                       np.full(self.runner.mask_words, -1, np.int32))
        with self._lock:
            self._inbox.append(seq)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append(request_id)

    def inbox_size(self) -> int:
        """How many submitted requests have not reached the waiting queue yet (thread-safe)."""
        with self._lock:
            return len(self._inbox)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self._inbox or self._aborts or self._inflight)

    @property
    def generated_tokens(self) -> int:
        return self.tokens.generated_tokens

    @property
    def forced_tokens(self) -> int:
        return self.tokens.forced_tokens

    # ---- the loop body ---------------------------------------------------------------------------------
    def step(self) -> None:
        with self.compiles.counting(), self.request_path.counting():
            self._step()

    def _step(self) -> None:
        self._take_inbox()
        with self._lock:
            aborts = set(self._aborts)
            self._aborts.clear()
        if aborts:
            self._apply_aborts(aborts)
        if self._inflight is not None and any(seq.inflight and not seq.fed and self.speculator.waits(
                seq, len(self.running)) for seq in self.running):
            previous, self._inflight = self._inflight, None  # a copying row drafts after its token: take it first
            self.complete(previous)
        plan = self.schedule()
        if plan.rows:
            plan = plan._replace(key=self.runner.launch([row.input for row in plan.rows]))
            self._launched(plan)
        if self._inflight is not None:
            previous, self._inflight = self._inflight, None
            self.complete(previous)
        if plan.rows:
            plan = plan._replace(rows=[row._replace(input=self._sample_input(row)) for row in plan.rows])
            self.runner.sample([row.input for row in plan.rows])
            for row in plan.rows:
                row.seq.inflight = row.input.samples
            self.steps += 1
            if self.overlap:
                self._inflight = plan
            else:
                self.complete(plan)
        self._sweep()

    def _take_inbox(self) -> bool:
        with self._lock:
            self.waiting.extend(self._inbox)
            arrived = bool(self._inbox)
            self._inbox.clear()
        return arrived

    def _apply_aborts(self, ids: set[str]) -> None:
        for seq in [s for s in self.waiting if s.req.request_id in ids]:
            self.waiting.remove(seq)
            self.tokens.finish(seq, "abort")
        for seq in self.running:
            if seq.req.request_id in ids:
                self.tokens.finish(seq, "abort")
        self._sweep()

    def fail_all(self, message: str) -> None:
        """End every running and waiting request with an error (a device step itself failed)."""
        self._take_inbox()
        self._inflight = None
        for seq in [*self.running, *self.waiting]:
            self.tokens.finish(seq, "error", error=message)
        self.waiting.clear()
        self._sweep()
        self.pool.reset_cache()  # a failed step may have left any page half written

    # ---- decisions ---------------------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        """The next step's rows (see the module docstring)."""
        rows: list[PlannedRow] = []
        budget, cap = self.runner.max_step_tokens, self.runner.max_step_rows
        self.speculator.limit = self.runner.max_verify_tokens
        if not self.runner.prefix_reuse:
            return self._schedule_uniform(budget, cap)
        for seq in list(self.running):
            used = sum(len(r.input.tokens) for r in rows)
            if len(rows) >= cap:
                break
            if seq.finished or seq.slot < 0 or used >= budget:
                continue
            take = self._runnable(seq, budget - used)
            if take and self._ensure_pages(seq, seq.computed + take, rows):
                rows.append(self._row(seq, take))
        while self.waiting and self.free_slots and len(rows) < cap:
            used = sum(len(r.input.tokens) for r in rows)
            if used >= budget or not self._admit(self.waiting[0]):
                break
            seq = self.waiting.popleft()
            if seq.finished or seq.slot < 0:
                continue
            take = min(len(seq.pending), budget - used)
            if self._ensure_pages(seq, seq.computed + take, rows):
                rows.append(self._row(seq, take))
        rows = [row for row in rows if row.seq.slot >= 0]
        return StepPlan(self.speculator.draft(rows, self.pool))

    def _schedule_uniform(self, budget: int, cap: int) -> StepPlan:
        """Recurrent models: the oldest row with several pending tokens alone, else a new arrival's first chunk
        alone, else every decoding row one token."""
        live = [seq for seq in self.running if not seq.finished and seq.slot >= 0]
        chunk = next((seq for seq in live if len(seq.pending) > 1), None)
        if chunk is None and self.waiting and self.free_slots and self._admit(self.waiting[0]):
            seq = self.waiting.popleft()
            if not seq.finished:
                chunk = seq
        if chunk is not None:
            take = min(len(chunk.pending), budget)
            return StepPlan([self._row(chunk, take)] if self._ensure_pages(chunk, chunk.computed + take, []) else [])
        rows: list[PlannedRow] = []
        for seq in live:
            if len(rows) >= cap:
                break
            if self._runnable(seq, 1) and self._ensure_pages(seq, seq.computed + 1, rows):
                rows.append(self._row(seq, 1))
        return StepPlan([row for row in rows if row.seq.slot >= 0])

    def _runnable(self, seq: Sequence, room: int) -> int:
        """How many tokens the request can run next (at most `room`): its pending ones, or its token still on the
        device (fed) unless that token will end it."""
        if seq.pending:
            return min(len(seq.pending), room)
        if not seq.inflight or seq.fed:
            return 0
        last = seq.generated + 1 >= seq.req.sampling.max_tokens or seq.position + 1 >= self.runner.max_context
        return 0 if last else 1

    def _row(self, seq: Sequence, take: int) -> PlannedRow:
        if not seq.pending:  # its sampled token, still on the device
            return PlannedRow(seq, RowInput(
                slot=seq.slot, tokens=[0], start=seq.computed, pages=list(seq.pages), fresh=seq.fresh,
                prompt_len=len(seq.prompt), count_from=seq.computed + 1, samples=True, mask=None, sampling=(),
                feed=True), seq.epoch)
        return PlannedRow(seq, RowInput(
            slot=seq.slot, tokens=seq.pending[:take], start=seq.computed, pages=list(seq.pages), fresh=seq.fresh,
            prompt_len=len(seq.prompt), count_from=seq.count_from, samples=take == len(seq.pending), mask=None,
            sampling=()), seq.epoch)

    def _launched(self, plan: StepPlan) -> None:
        """The step's forward is on its way: each row's tokens count as computed."""
        for seq, row, _ in plan.rows:
            seq.computed += len(row.tokens)
            if row.feed:
                seq.fed = True
            else:
                seq.pending = seq.pending[len(row.tokens):]
            seq.fresh = False
        self._key_pages(plan)

    def _sample_input(self, planned: PlannedRow) -> RowInput:
        """A launched row as its sampler sees it now: whether it still samples (not finished, preempted, or sent
        to run forced text first), its mask and its sampling values."""
        seq, row, epoch = planned
        samples = row.samples and not seq.finished and seq.epoch == epoch and not seq.pending
        mask = None
        if samples and seq.req.constraint is not None:
            mask = seq.draft_masks if row.drafts else seq.mask
        values = (*seq.sampling[:8], seq.generated, seq.sampling[8]) if seq.sampling else row.sampling
        return row._replace(samples=samples, mask=mask, sampling=values or _NEUTRAL,
                            bias=seq.req.sampling.logit_bias if samples else ())

    def _ensure_pages(self, seq: Sequence, upto: int, rows: list[PlannedRow]) -> bool:
        """Extend the row's pages to cover positions < upto, preempting the newest requests while none can be had.
        False when the row itself was preempted (or finished: it alone needs more than the pool holds)."""
        need = self.pool.pages_for(upto) - len(seq.pages)
        while need > 0:
            got = self.pool.allocate(need)
            if got is not None:
                seq.pages += got
                return True
            victim = max((s for s in self.running if not s.finished and s.slot >= 0), key=lambda s: s.arrival)
            if victim is seq and len([s for s in self.running if not s.finished]) == 1:
                self.tokens.finish(seq, "length")  # alone, and the pool is still too small for it
                return False
            self._preempt(victim)
            rows[:] = [row for row in rows if row.seq is not victim]
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.pool.release(seq.pages)
        self.free_slots.append(seq.slot)
        self.running.remove(seq)
        seq.pages, seq.keyed, seq.slot = [], None, -1
        seq.computed, seq.pending, seq.fresh = 0, [], True
        seq.inflight = seq.fed = False
        seq.epoch += 1
        seq.preempted += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def _admit(self, seq: Sequence) -> bool:
        """Give the request at the head of the queue a slot and the pages of its tokens (mapping the cached ones);
        False when the pages cannot be had yet (it stays first in the queue). A request that can never run is
        finished (True: it leaves the queue)."""
        req, ps = seq.req, self.pool.page_size
        recompute = seq.started
        if not recompute and not self._start(seq):
            return True
        tokens = seq.tokens
        s = req.sampling
        limit = (len(tokens) - 1) // ps  # the last token is always run: its logits give the next one
        if s.repetition_penalty != 1.0:
            limit = 0  # its prompt mask is built from the tokens a step runs
        elif s.presence_penalty or s.frequency_penalty:
            limit = min(limit, len(seq.prompt) // ps)  # outputs are counted as they are run
        total = self.pool.pages_for(len(tokens))
        if total > self.pool.capacity:
            self.tokens.finish(seq, "error", error=f"prompt_ids: {len(tokens)} tokens need {total} pages of {ps}; "
                                                   f"the KV pool holds {self.pool.capacity}")
            return True
        matched = self.pool.match(tokens, limit)
        pages = self.pool.allocate(total - len(matched))
        if pages is None:
            self.pool.release(matched)
            return False
        seq.pages, seq.keyed = matched + pages, None
        seq.computed = len(matched) * ps
        if not recompute:
            seq.cached = seq.computed
            self.prefix_hit_tokens += seq.computed
        seq.slot, seq.fresh = self.free_slots.pop(), True
        self.running.append(seq)
        self.tokens.start(seq, recompute)
        return True

    def _start(self, seq: Sequence) -> bool:
        """First admission: check the prompt, make the detokeniser and stop matcher, the sampling values and the
        first mask. False (the request finished with an error) when it cannot run."""
        req = seq.req
        try:
            n = len(req.prompt_ids)
            if n == 0:
                raise ValueError("prompt_ids is empty")
            if n >= self.runner.max_context:
                raise ValueError(f"prompt_ids: {n} tokens leave no room in the context of {self.runner.max_context}")
            if self.tokenizer is not None:  # without a tokenizer (random-weight benchmarks) there is no text
                seq.detok = IncrementalDetokenizer(self.tokenizer, req.prompt_ids)
            seq.stops = StopStringMatcher(req.sampling.stop)
            seq.sampling = sampling_values(req)
            if req.constraint is not None:
                req.constraint.fill_mask(seq.mask)
            self.speculator.start(seq)
        except Exception as e:  # noqa: BLE001 - reported on the request, others continue
            self.tokens.finish(seq, "error", error=f"{type(e).__name__}: {e}")
            return False
        seq.started = True
        return True

    # ---- after the step ------------------------------------------------------------------------------------
    def complete(self, plan: StepPlan) -> None:
        """Take each sampling row's token (waiting for the step's sampler), then key the rows' newly full pages."""
        taking = [(i, row) for i, row in enumerate(plan.rows) if row.input.samples]
        if taking:
            out = self.runner.fetch(logprobs=any(row.seq.req.sampling.logprobs is not None for _, row in taking))
            positions = StepRunner.positions_of(plan.key, [row.input for row in plan.rows])
            rows = []
            for i, (seq, row, epoch) in taking:
                if seq.epoch != epoch or not seq.inflight:
                    continue
                seq.inflight = False
                if seq.finished:
                    continue
                if row.drafts:
                    own = positions[i][-(row.drafts + 1):]
                    n = self.speculator.verified(seq, row, [out.tokens[j] for j in own])
                    rows.append((seq, out, list(own[:n])))
                else:
                    self.speculator.decoded(seq)
                    rows.append((seq, out, [positions[i][-1]]))
            self.tokens.take_all(rows)
        self._key_pages(plan)

    def _key_pages(self, plan: StepPlan) -> None:
        """Key the rows' full pages whose tokens are known (their K/V is written by a step already dispatched: a
        later step that maps them runs after it)."""
        if not self.pool.prefix_caching:
            return
        ps = self.pool.page_size
        for seq, _, epoch in plan.rows:
            if seq.finished or seq.epoch != epoch:
                continue
            known = min(seq.computed, len(seq.prompt) + len(seq.out_ids))
            if known // ps > (seq.keyed or (0,))[0]:
                seq.keyed = self.pool.register(seq.pages, seq.tokens[:known], seq.keyed)

    def _sweep(self) -> None:
        """Free the slots and pages of finished requests."""
        done = [seq for seq in self.running if seq.finished]
        for seq in done:
            self.running.remove(seq)
            self.pool.release(seq.pages)
            self.free_slots.append(seq.slot)
            seq.pages, seq.slot = [], -1
        if any(seq.finished for seq in self.waiting):
            self.waiting = collections.deque(seq for seq in self.waiting if not seq.finished)


_NEUTRAL = (0.0, 1.0, 0, 0.0, 0.0, 0.0, 1.0, 0, 0, False)  # a row with no sampling values (never samples)


def sampling_values(req: GenerationRequest) -> tuple:
    """A request's `SamplingArrays` values in field order, less `step` (the generated count, added per step
    before the last, `logprobs`)."""
    s = req.sampling
    seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(4), "little")
    return (max(s.temperature, 0.0), s.top_p, s.top_k, s.min_p, s.presence_penalty, s.frequency_penalty,
            s.repetition_penalty, seed & 0xFFFFFFFF, s.logprobs is not None)
