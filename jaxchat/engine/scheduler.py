"""Continuous batching over a paged KV pool: what each step runs, decided on the host (no JAX, no runner).

Contract (the scheduler only decides; `core.EngineCore` executes its plans with the runner):
- `Scheduler(shape, tokenizer, eos_token_ids, ...)` plans within a `plan.SchedulerShape` (slots, context, pool,
  mask width). `submit(request, emit)` queues a request (thread-safe); `emit(GenerationOutput)` is called (from
  the thread that calls `update`) with each delta, the last one having `finished=True` and a `finish_reason`.
  `abort(request_id)` (thread-safe) ends it at the next `schedule()`.
- The step API, in the order the core calls it:
  `schedule(limits) -> StepPlan`: takes the arrivals and aborts, decides the step's rows within `limits`
  (`plan.StepLimits`: what the programs compiled so far can run, see below) and counts their tokens as
  computed (the core launches every plan it gets);
  `to_sample(plan) -> StepPlan`: the launched rows as their sampler sees them now (after the previous step's
  tokens were taken): whether each still samples, its mask and sampling values;
  `update(plan, result)`: a step's sampled tokens (`plan.StepResult`, None when no row sampled) go to the token
  handler (`tokens.TokenHandler`); then the rows' newly full pages are keyed and what finished requests held is
  freed. `needs_tokens_first()`: whether the in-flight step's tokens must be taken before the next plan (a
  drafting row copies text: its drafts follow its token).
- Overlap (the core's `overlap=True`): a step is planned and launched before the previous step's sampled tokens
  are taken. A row whose token is still on the device is scheduled with that token fed from the device
  (`RowInput.feed`), unless that token will be its last (`max_tokens`, the context). A row found finished when
  its token is taken has its sample in the running step dropped (one extra token computed, never emitted); a
  row whose token brings forced text (jump-forward) drops it too and runs the forced tokens in the next step.
  Greedy outputs are those of `overlap=False` (schedule, sample, update in turn).
- `schedule()`: within one step's token budget (`limits.max_step_tokens`) and rows (`limits.max_step_rows`:
  both those of the programs compiled so far while the rest compile in the background, so a long prompt runs
  in chunks of a ready program) it takes
  every running request's pending tokens, oldest first (one token while decoding, the sampled token and forced
  text after a jump, the next chunk of a prompt), then admits waiting requests in arrival order while a slot,
  budget and the pages of the whole prompt can be had; each row's page table is extended to cover what it runs.
  A row samples when the step runs its last pending token.
  Models with recurrent layers get uniform steps only: one row's chunk alone, or every row one token.
- Slots and pages (`residency.Residency`): a request holds a slot and the pages of its tokens from admission to
  its end; admission maps the longest cached run of full pages of its prompt (prefix reuse: `--no-prefix-cache`
  keys nothing, models with recurrent layers never share) and counts them in `num_cached_tokens` /
  `prefix_hit_tokens`; full pages whose K/V are written are keyed after each launch.
- Pressure: when a running row needs a page and none can be had (free or evictable), the newest request is
  preempted (`Residency.ensure_pages`) and goes back to the front of the queue; when admitted again its prompt
  and outputs are recomputed (a prefill like any other) and it goes on sampling from where it was, its grammar,
  detokeniser and sampling steps untouched, so greedy output is what it would have been. A request that alone
  needs more pages than the pool has ends with "length" (or, if its prompt never fits, "error").
- Per row: its own constraint (None = all-ones mask, no host work), sampling parameters and stop conditions
  (see `tokens`). An exception raised while handling one request ends that request with finish_reason
  "error"; the other requests continue. `fail_all` ends everything (a device step itself failed) and forgets
  the prefix cache.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from jaxchat.engine.inbox import Inbox
from jaxchat.engine.pages import PagePool
from jaxchat.engine.plan import NEUTRAL_SAMPLING, PlannedRow, RowInput, SchedulerShape, StepLimits, StepPlan, StepResult
from jaxchat.engine.residency import Residency
from jaxchat.engine.sequence import Sequence
from jaxchat.engine.speculate import Speculator
from jaxchat.engine.tokens import TokenHandler
from jaxchat.engine.types import GenerationOutput, GenerationRequest

Emit = Callable[[GenerationOutput], None]


class Scheduler:
    def __init__(self, shape: SchedulerShape, tokenizer: Any, eos_token_ids: tuple[int, ...] = (),
                 jump_forward: bool = True, prefix_cache: bool = True, salt: bytes = b"", draft_tokens: int = 0) -> None:
        self.shape = shape
        self.speculator = Speculator(draft_tokens, shape.max_verify_tokens, shape.max_context, shape.mask_words)
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(eos_token_ids)
        self.token_handler = TokenHandler(tokenizer, shape.max_context, jump_forward=jump_forward)
        pool = PagePool(shape.num_pages, shape.page_size, prefix_cache and shape.prefix_reuse, salt)
        self.residency = Residency(pool, shape.max_batch, self.token_handler)  # who holds which slot and pages
        # the residency's collections, read and mutated in place here (never rebound)
        self.pool, self.running, self.waiting = pool, self.residency.running, self.residency.waiting
        self.free_slots = self.residency.free_slots
        self.inbox = Inbox()  # submissions and aborts from other threads
        self._arrivals = itertools.count()
        self.steps = 0

    # ---- thread-safe entry points -----------------------------------------------------------------
    def submit(self, request: GenerationRequest, emit: Emit) -> None:
        s = request.sampling
        stop_ids = set(s.stop_token_ids) | (set() if s.ignore_eos else set(self.eos_ids))
        seq = Sequence(request, emit, frozenset(stop_ids), next(self._arrivals),
                       np.full(self.shape.mask_words, -1, np.int32))
        self.inbox.put(seq)

    def abort(self, request_id: str) -> None:
        self.inbox.abort(request_id)

    def inbox_size(self) -> int:
        """How many submitted requests have not reached the waiting queue yet (thread-safe)."""
        return self.inbox.size()

    def has_work(self) -> bool:
        """Whether a request is queued, running or to be aborted (the core adds its step in flight)."""
        return bool(self.running or self.waiting or self.inbox.busy())

    @property
    def generated_tokens(self) -> int:
        return self.token_handler.generated_tokens

    @property
    def forced_tokens(self) -> int:
        return self.token_handler.forced_tokens

    @property
    def prefix_hit_tokens(self) -> int:
        return self.residency.prefix_hit_tokens

    @property
    def preemptions(self) -> int:
        return self.residency.preemptions

    # ---- the step API -------------------------------------------------------------------------------------
    def needs_tokens_first(self) -> bool:
        """Whether the step in flight's tokens must be taken before the next plan: a drafting row whose token is
        still on the device copies known text (its drafts follow that token)."""
        return any(seq.inflight and not seq.fed and self.speculator.waits(seq, len(self.running))
                   for seq in self.running)

    def schedule(self, limits: StepLimits) -> StepPlan:
        """Take the arrivals and aborts, then the next step's rows (see the module docstring); their tokens count
        as computed from here on (the core launches the plan)."""
        arrived, aborts = self.inbox.take()
        self.waiting.extend(arrived)
        if aborts:
            self._apply_aborts(aborts)
        plan = self._decide(limits)
        if plan.rows:
            self._launched(plan)
        self.residency.sweep()
        return plan

    def to_sample(self, plan: StepPlan) -> StepPlan:
        """The launched plan as its sampler sees it now; each sampling row's token is in flight from here on."""
        plan = plan._replace(rows=[row._replace(input=self._sample_input(row)) for row in plan.rows])
        for row in plan.rows:
            row.seq.inflight = row.input.samples
        self.steps += 1
        return plan

    def update(self, plan: StepPlan, result: StepResult | None) -> None:
        """Take each sampling row's token from `result`, key the rows' newly full pages, free what finished
        requests held."""
        rows = []
        for i, (seq, row, epoch) in enumerate(plan.rows):
            if not row.samples or seq.epoch != epoch or not seq.inflight:
                continue
            seq.inflight = False
            if seq.finished:
                continue
            own = result.positions[i]
            if row.drafts:
                own = own[-(row.drafts + 1):]
                n = self.speculator.verified(seq, row, [result.out.tokens[j] for j in own])
                rows.append((seq, result.out, list(own[:n])))
            else:
                self.speculator.decoded(seq)
                rows.append((seq, result.out, [own[-1]]))
        if rows:
            self.token_handler.take_all(rows)
        self.residency.key_pages(plan.rows)
        self.residency.sweep()

    def _apply_aborts(self, ids: set[str]) -> None:
        for seq in [s for s in self.waiting if s.req.request_id in ids]:
            self.waiting.remove(seq)
            self.token_handler.finish(seq, "abort")
        for seq in self.running:
            if seq.req.request_id in ids:
                self.token_handler.finish(seq, "abort")
        self.residency.sweep()

    def fail_all(self, message: str) -> None:
        """End every running and waiting request with an error (a device step itself failed)."""
        self.waiting.extend(self.inbox.take()[0])
        for seq in [*self.running, *self.waiting]:
            self.token_handler.finish(seq, "error", error=message)
        self.waiting.clear()
        self.residency.sweep()
        self.pool.reset_cache()  # a failed step may have left any page half written

    # ---- decisions ---------------------------------------------------------------------------------------
    def _decide(self, limits: StepLimits) -> StepPlan:
        rows: list[PlannedRow] = []
        budget, cap = limits.max_step_tokens, limits.max_step_rows
        self.speculator.limit = limits.max_verify_tokens
        if not self.shape.prefix_reuse:
            return self._schedule_uniform(budget, cap)
        for seq in list(self.running):
            used = sum(len(r.input.tokens) for r in rows)
            if len(rows) >= cap:
                break
            if seq.finished or seq.slot < 0 or used >= budget:
                continue
            take = self._runnable(seq, budget - used)
            if take and self.residency.ensure_pages(seq, seq.computed + take, rows):
                rows.append(self._row(seq, take))
        while self.waiting and self.free_slots and len(rows) < cap:
            used = sum(len(r.input.tokens) for r in rows)
            if used >= budget or not self._admit(self.waiting[0]):
                break
            seq = self.waiting.popleft()
            if seq.finished or seq.slot < 0:
                continue
            take = min(len(seq.pending), budget - used)
            if self.residency.ensure_pages(seq, seq.computed + take, rows):
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
            return StepPlan([self._row(chunk, take)] if self.residency.ensure_pages(chunk, chunk.computed + take, []) else [])
        rows: list[PlannedRow] = []
        for seq in live:
            if len(rows) >= cap:
                break
            if self._runnable(seq, 1) and self.residency.ensure_pages(seq, seq.computed + 1, rows):
                rows.append(self._row(seq, 1))
        return StepPlan([row for row in rows if row.seq.slot >= 0])

    def _runnable(self, seq: Sequence, room: int) -> int:
        """How many tokens the request can run next (at most `room`): its pending ones, or its token still on the
        device (fed) unless that token will end it."""
        if seq.pending:
            return min(len(seq.pending), room)
        if not seq.inflight or seq.fed:
            return 0
        last = seq.generated + 1 >= seq.req.sampling.max_tokens or seq.position + 1 >= self.shape.max_context
        return 0 if last else 1

    def _row(self, seq: Sequence, take: int) -> PlannedRow:
        if not seq.pending:  # its sampled token, still on the device
            return PlannedRow(seq, RowInput(
                slot=seq.slot, tokens=[0], start=seq.computed, pages=list(seq.pages), fresh=seq.fresh,
                prompt_len=len(seq.prompt), count_from=seq.computed + 1, samples=True, mask=None, sampling=NEUTRAL_SAMPLING,
                feed=True), seq.epoch)
        return PlannedRow(seq, RowInput(
            slot=seq.slot, tokens=seq.pending[:take], start=seq.computed, pages=list(seq.pages), fresh=seq.fresh,
            prompt_len=len(seq.prompt), count_from=seq.count_from, samples=take == len(seq.pending), mask=None,
            sampling=NEUTRAL_SAMPLING), seq.epoch)

    def _launched(self, plan: StepPlan) -> None:
        """The step's forward is on its way: each row's tokens count as computed."""
        for seq, row, _ in plan.rows:
            seq.computed += len(row.tokens)
            if row.feed:
                seq.fed = True
            else:
                seq.pending = seq.pending[len(row.tokens):]
            seq.fresh = False
        self.residency.key_pages(plan.rows)

    def _sample_input(self, planned: PlannedRow) -> RowInput:
        """A launched row as its sampler sees it now: whether it still samples (not finished, preempted, or sent
        to run forced text first), its mask and its sampling values."""
        seq, row, epoch = planned
        samples = row.samples and not seq.finished and seq.epoch == epoch and not seq.pending
        mask = None
        if samples and seq.req.constraint is not None:
            mask = seq.draft_masks if row.drafts else seq.mask
        values = seq.sampling._replace(step=seq.generated) if seq.sampling else row.sampling
        return row._replace(samples=samples, mask=mask, sampling=values,
                            bias=seq.req.sampling.logit_bias if samples else ())

    def _admit(self, seq: Sequence) -> bool:
        """Open the request at the head of the queue (its first admission) and give it a slot and pages
        (`Residency.admit`)."""
        if not seq.started:
            if not self.token_handler.open(seq):
                return True
            self.speculator.start(seq)
        return self.residency.admit(seq)
