"""Continuous batching over a fixed set of slots: the synchronous host loop body.

Contract:
- `Scheduler.submit(request, emit)` queues a request; `emit(GenerationOutput)` is called (from the thread
  that calls `step()`) with each delta, the last one having `finished=True` and a `finish_reason`.
- `step()` does one iteration: apply aborts, admit and prefill up to `max_prefills_per_step` waiting
  requests into free slots (more when their prompts are short enough to share batched prefill programs,
  `runner.prefill_rows`: a burst of arrivals, or turns whose prefix the cache holds, costs one program), then
  one batched decode step over the running rows.  Active requests always
  occupy slots `0..n-1` (a finished request's slot is refilled by moving the highest one down), so the
  decode batch bucket is the smallest one >= n and host work is proportional to the active rows only.
- `after_prefills` (optional): called after a step's prefills and before its decode, so the caller can hand
  the new rows' first tokens out without waiting for the decode (the engine flushes its mailbox there).
  Requests submitted while a step's prefills ran are admitted in a second round before its decode (a burst
  whose first arrival woke an idle engine is not split by a decode step); each round admits up to
  `max_prefills_per_step` prompts that need a program of their own.
- Mixed steps (`runner.prefill_chunk` > 0): a request admitted while other rows decode is not prefilled in a
  program of its own. Its prompt (and the forced text after it) is run in chunks inside the decode steps of the
  running rows (`runner.mixed`), several arrivals' chunks in one step: each step carries the chunking rows of a
  window of K consecutive rows that holds the oldest arrival, with a chunk length C (K * C within the per-step
  token budget, `runner.mixed_shapes`), choosing the shape that ends the most prompts, then runs the most
  tokens, then costs the fewest. The token sampled after a row's last chunk is its first output. Running rows
  never stall for an arrival, and a burst of arrivals is not staggered one per step. With no row decoding when
  a step begins, its arrivals (both admission rounds: a burst that woke an idle engine) are prefilled whole
  as before (`mixed_steps` counts the mixed steps).
- Per row: its own constraint (None = all-ones mask, no host work), sampling parameters and stop
  conditions (eos ids unless `ignore_eos`, `stop_token_ids`, stop strings, `max_tokens`,
  `constraint.is_terminated()`, the context filling up -> "length").  A stop token's text is not emitted.
- An exception raised while handling one request (constraint, detokeniser, invalid prompt) ends that
  request with finish_reason "error" and `error` set; the other requests continue.
- Prefix reuse (when `runner.keep_prefixes`): a finished request's row keeps its K/V and is recorded in a
  `ResidentPrefixes`; rows are swapped, not overwritten, when compacting. A new request takes the idle row
  `ResidentPrefixes.plan` picks (swapped into place; the longest shared prefix copied in from another row
  when that row keeps its record) and prefills only the rest. The reused count is reported as
  `num_cached_tokens` on every output and summed in `prefix_hit_tokens`.
- Jump-forward (`jump_forward`, for constraints with `forced_text`, requests without logprobs): when the
  grammar admits exactly one continuation after a token, its tokens (as the tokenizer spells them after that
  token, less the last) are taken without sampling: checked like sampled tokens, emitted as one delta,
  counted in `forced_tokens`. After a prefill's prompt they ride in the prefill itself; after a sampled token
  the row sits out the next decode and runs [token, *forced] in one extend step (`runner.extend`) instead.
- Forced text is spelled the same way without jump-forward (`jump_forward=False`, or a request with logprobs):
  the same tokens are planned after a sampled token (or the prompt) and taken one per decode step, each
  step's mask narrowed to the planned token (`_pin`), then the model samples the token after them under the
  grammar's mask, as with jump-forward. The two modes differ only in how many device steps the forced
  tokens take (and the float rounding of the programs that ran them): the model never sees a forced text
  spelled in pieces it was not trained on (`<`, `tool`, `_call` for the `<tool_call>` token).
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from jaxchat.engine.jump_forward import forced_token_ids
from jaxchat.engine.prefix_cache import ResidentPrefixes
from jaxchat.engine.sampler import SampleOut, SamplingArrays
from jaxchat.engine.step import StepRunner, bucket_for
from jaxchat.engine.tokenizer import IncrementalDetokenizer, StopStringMatcher
from jaxchat.engine.types import GenerationOutput, GenerationRequest, TokenLogprob

Emit = Callable[[GenerationOutput], None]
MAX_JUMP = 64  # forced tokens taken in one extend step (more come in the next)


@dataclass(eq=False)
class _Seq:
    req: GenerationRequest
    emit: Emit
    stop_ids: frozenset[int]
    detok: IncrementalDetokenizer | None = None
    stops: StopStringMatcher | None = None
    slot: int = -1
    pos: int = 0  # cache position the next input token is written at
    written: int = 0  # tokens (prompt, then fed-back outputs) whose K/V the row holds
    cached: int = 0  # prompt tokens reused from an idle row's prefix
    generated: int = 0
    finished: bool = False
    out_ids: list[int] = field(default_factory=list)
    pending: list[int] | None = None  # jump-forward: the sampled token and forced tokens its extend step runs
    chunks: list[int] | None = None  # mixed steps: the prompt and forced text still being prefilled in chunks
    chunk_from: int = 0  # the position of its next chunk
    chunk_fresh: bool = True  # no chunk has run yet (the next one resets the row's counts and prompt mask)
    planned: list[int] = field(default_factory=list)  # forced tokens still to take one per step (no jumping)


class Scheduler:
    def __init__(self, runner: StepRunner, tokenizer: Any, eos_token_ids: tuple[int, ...] = (),
                 max_prefills_per_step: int = 4, jump_forward: bool = True) -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.eos_ids = frozenset(eos_token_ids)
        self.max_prefills_per_step = max_prefills_per_step
        b, w = runner.max_batch, runner.mask_words
        self.slots: list[_Seq | None] = [None] * b
        self.n_active = 0
        self.tokens = np.zeros(b, np.int32)
        self.positions = np.full(b, -1, np.int32)
        self.bitmask = np.full((b, w), -1, np.int32)
        self.sp = SamplingArrays.numpy(b)
        self.waiting: collections.deque[_Seq] = collections.deque()
        self._inbox: collections.deque[_Seq] = collections.deque()
        self._aborts: collections.deque[str] = collections.deque()
        self._lock = threading.Lock()
        self.steps = 0
        self.generated_tokens = 0
        self.prefix_hit_tokens = 0
        self.prefixes = ResidentPrefixes(b) if runner.keep_prefixes else None
        self.jump_forward = jump_forward and tokenizer is not None
        self.forced_tokens = 0
        self._extends: list[_Seq] = []
        self.mixed_steps = 0
        self._chunking: collections.deque[_Seq] = collections.deque()  # admitted, prompt still in chunks
        self._running = False  # whether a row was decoding when the current step began
        # called after a step's prefills, before its decode: the engine hands the first tokens out right away
        self.after_prefills: Callable[[], None] | None = None

    # ---- thread-safe entry points -----------------------------------------------------------------
    def submit(self, request: GenerationRequest, emit: Emit) -> None:
        s = request.sampling
        stop_ids = set(s.stop_token_ids) | (set() if s.ignore_eos else set(self.eos_ids))
        with self._lock:
            self._inbox.append(_Seq(request, emit, frozenset(stop_ids)))

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append(request_id)

    def inbox_size(self) -> int:
        """How many submitted requests have not reached the waiting queue yet (thread-safe)."""
        with self._lock:
            return len(self._inbox)

    def has_work(self) -> bool:
        return bool(self.n_active or self.waiting or self._inbox or self._aborts)

    # ---- the loop body ---------------------------------------------------------------------------
    def step(self) -> None:
        self._take_inbox()
        with self._lock:
            aborts = set(self._aborts)
            self._aborts.clear()
        if self.prefixes is not None:
            self.prefixes.tick()
        if aborts:
            self._apply_aborts(aborts)
        if self._extends:
            self._run_extends()
        # rows admitted in this step's rounds are not running yet: arrivals beside them prefill, not chunk
        self._running = self._any_decoding()
        if self._admit_waiting():
            self._hand_out()
            # a burst's later arrivals, come in while those prompts ran, are prefilled before the decode too
            if self._take_inbox() and self._admit_waiting():
                self._hand_out()
        if any(seq.finished for seq in self._chunking):
            self._chunking = collections.deque(seq for seq in self._chunking if not seq.finished)
        if self._chunking and not self._any_decoding():  # nothing to ride with: fresh prompts prefill whole
            fresh = [seq for seq in self._chunking if seq.chunk_fresh]
            self._chunking = collections.deque(seq for seq in self._chunking if not seq.chunk_fresh)
            self._prefill_jobs([(seq, seq.chunks, seq.chunk_from) for seq in fresh])
        if self._chunking:
            self._mixed()
        elif self._any_decoding():
            self._decode()
        self.steps += 1

    def _take_inbox(self) -> bool:
        """Move newly submitted requests to the waiting queue; whether there were any."""
        with self._lock:
            self.waiting.extend(self._inbox)
            arrived = bool(self._inbox)
            self._inbox.clear()
        return arrived

    def _hand_out(self) -> None:
        if self.after_prefills is not None:
            self.after_prefills()

    def _admit_waiting(self) -> bool:
        """Admit waiting requests into free rows and prefill their prompts: up to `max_prefills_per_step` that
        each need a program of their own, and beside them as many short ones as one batched prefill takes
        (`StepRunner.prefill_rows`: a burst of arrivals, typically turns whose prefix the cache holds).
        Returns whether any prompt was prefilled."""
        r = self.runner
        most = max(self.max_prefills_per_step, *r.prefill_batches, 0)
        jobs: list[tuple[_Seq, list[int], int]] = []
        admitted = alone = 0
        while (self.waiting and self.n_active < len(self.slots) and admitted < most
               and alone < self.max_prefills_per_step):
            job = self._admit(self.waiting.popleft())
            admitted += 1
            if job is not None:
                jobs.append(job)
                alone += r.rows_bucket(1, len(job[1]) - job[2]) is None
        self._prefill_jobs(jobs)
        return bool(jobs)

    def _prefill_jobs(self, jobs: list[tuple[_Seq, list[int], int]]) -> None:
        """Prefill admitted prompts (seq, tokens, start): in batched programs where consecutive rows' prompts
        share one (`StepRunner.prefill_rows`), each alone otherwise."""
        if not self.runner.prefill_batches:
            for seq, tokens, start in jobs:
                self._prefill(seq, tokens, start)
            return
        for group in self._row_groups(jobs):
            if len(group) == 1:
                self._prefill(*group[0], compact=False)
            else:
                self._prefill_group(group)
        self._compact()

    def _row_groups(self, jobs: list[tuple[_Seq, list[int], int]]) -> list[list[tuple[_Seq, list[int], int]]]:
        """The admitted prompts in runs of consecutive rows that one batched prefill program takes."""
        groups: list[list[tuple[_Seq, list[int], int]]] = []
        longest = 0
        for job in sorted((j for j in jobs if not j[0].finished), key=lambda j: j[0].slot):
            n = len(job[1]) - job[2]
            last = groups[-1] if groups else None
            if (last is not None and last[-1][0].slot + 1 == job[0].slot
                    and self.runner.rows_bucket(len(last) + 1, max(longest, n)) is not None):
                last.append(job)
                longest = max(longest, n)
            else:
                groups.append([job])
                longest = n
        return groups

    def _prefill_group(self, group: list[tuple[_Seq, list[int], int]]) -> None:
        """Prefill consecutive rows' prompts in one batched program and take each row's first token."""
        slot, k = group[0][0].slot, len(group)
        sp = SamplingArrays(*(a[slot : slot + k] for a in self.sp))
        rows = [(tokens, start, len(seq.req.prompt_ids)) for seq, tokens, start in group]
        out = self.runner.prefill_rows(slot, rows, self.bitmask[slot : slot + k], sp)
        for i, (seq, tokens, _) in enumerate(group):
            seq.chunks = None
            seq.written = len(tokens)
            self._on_token(seq, out, i)

    def _any_decoding(self) -> bool:
        """Whether an active row takes part in the next decode step (rows waiting for an extend step or a
        prompt chunk hold position -1)."""
        return bool((self.positions[: self.n_active] >= 0).any())

    def fail_all(self, message: str) -> None:
        """End every running and waiting request with an error (a device step itself failed)."""
        self._take_inbox()
        for seq in [s for s in self.slots[: self.n_active] if s is not None] + list(self.waiting):
            self._finish(seq, "error", error=message)
        self.waiting.clear()
        self._extends.clear()
        self._chunking.clear()
        self._compact()
        if self.prefixes is not None:  # a failed step may have left any row's K/V half written
            self.prefixes = ResidentPrefixes(len(self.slots))

    def _apply_aborts(self, ids: set[str]) -> None:
        for seq in [s for s in self.waiting if s.req.request_id in ids]:
            self.waiting.remove(seq)
            self._finish(seq, "abort")
        for seq in self.slots[: self.n_active]:
            if seq is not None and seq.req.request_id in ids:
                self._finish(seq, "abort")
        self._compact()

    def _admit(self, seq: _Seq) -> tuple[_Seq, list[int], int] | None:
        """Place a waiting request in a row (reusing a held prefix) and take the text its grammar forces first.
        Returns (seq, tokens, start) for the caller to prefill tokens[start:], or None: it finished already, or
        its prompt rides in the running rows' steps (mixed steps)."""
        req, r = seq.req, self.runner
        try:
            n = len(req.prompt_ids)
            if n == 0:
                raise ValueError("prompt_ids is empty")
            if n >= r.max_context:
                raise ValueError(f"prompt_ids: {n} tokens leave no room in the context of {r.max_context}")
            if self.tokenizer is not None:  # without a tokenizer (random-weight benchmarks) there is no text
                seq.detok = IncrementalDetokenizer(self.tokenizer, req.prompt_ids)
            seq.stops = StopStringMatcher(req.sampling.stop)
            slot = self.n_active
            self._set_sampling(slot, req)
            row = self.bitmask[slot]
            row.fill(-1)
            if req.constraint is not None:
                req.constraint.fill_mask(row)
        except Exception as e:  # noqa: BLE001 - reported on the request, others continue
            self._finish(seq, "error", error=f"{type(e).__name__}: {e}")
            return None
        seq.slot, seq.pos = slot, n
        self.slots[slot] = seq
        self.n_active += 1
        start = self._take_prefix(slot, req.prompt_ids)
        seq.cached = start
        self.prefix_hit_tokens += start
        forced = self._jump(seq, req.prompt_ids[-1], n - start)  # text the grammar forces first rides in the prefill
        if not forced and not seq.finished:
            self._pin(seq, req.prompt_ids[-1], plan=True)
        if seq.finished:
            self._compact()
            return None
        self.sp.step[slot] = seq.generated
        tokens = [*req.prompt_ids, *forced]
        seq.written = start
        if r.prefill_chunk and self._running:  # ride in the running rows' steps
            seq.chunks, seq.chunk_from = tokens, start
            self._chunking.append(seq)
            return None
        return seq, tokens, start

    def _prefill(self, seq: _Seq, tokens: list[int], start: int, compact: bool = True) -> None:
        """Prefill tokens[start:] (the prompt, then forced text) into the row in a program of its own and take
        the token sampled after them."""
        slot, n = seq.slot, len(seq.req.prompt_ids)
        seq.chunks = None
        sp1 = SamplingArrays(*(a[slot : slot + 1] for a in self.sp))
        out = self.runner.prefill(slot, tokens, self.bitmask[slot : slot + 1], sp1, start, prompt_len=n)
        seq.written = len(tokens)
        self._on_token(seq, out, 0)
        if compact:
            self._compact()

    def _take_prefix(self, slot: int, prompt: list[int]) -> int:
        """Put the request's row in `slot`: the idle row `ResidentPrefixes.plan` picks, swapped into place (so
        the row there keeps its own record), with the reusable prefix copied over when another row holds it.
        Returns how many prompt tokens the row then holds (0: prefill everything)."""
        if self.prefixes is None:
            return 0
        plan = self.prefixes.plan(prompt, range(slot, len(self.slots)))
        source = plan.source
        if plan.row != slot:  # both rows idle: what they hold is their records
            self.runner.swap(plan.row, slot, extent=max(self.prefixes.length(plan.row), self.prefixes.length(slot)))
            self.prefixes.swapped(plan.row, slot)
            source = {plan.row: slot, slot: plan.row}.get(source, source)  # where the swap left it
        if plan.length and source != slot:
            self.runner.move(source, slot, extent=plan.length)
        self.prefixes.forget(slot)
        return plan.length

    def _set_sampling(self, slot: int, req: GenerationRequest) -> None:
        s, sp = req.sampling, self.sp
        sp.temperature[slot] = max(s.temperature, 0.0)
        sp.top_p[slot] = s.top_p
        sp.top_k[slot] = s.top_k
        sp.min_p[slot] = s.min_p
        sp.presence[slot] = s.presence_penalty
        sp.frequency[slot] = s.frequency_penalty
        sp.repetition[slot] = s.repetition_penalty
        seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(4), "little")
        sp.seed[slot] = seed & 0xFFFFFFFF
        sp.step[slot] = 0
        sp.logprobs[slot] = s.logprobs is not None

    def _decode(self) -> None:
        b = bucket_for(self.n_active, self.runner.batch_buckets)
        sp = SamplingArrays(*(a[:b] for a in self.sp))
        ran = self.positions[:b] >= 0  # rows waiting for an extend step (or a prompt chunk) sit this one out
        out = self.runner.decode(self.tokens[:b], self.positions[:b], self.bitmask[:b], sp)
        self._take_decoded(out, ran)
        self._compact()

    def _take_decoded(self, out: SampleOut, ran: np.ndarray) -> None:
        for i in range(self.n_active):
            seq = self.slots[i]
            if seq is not None and not seq.finished and ran[i]:
                seq.written = int(self.positions[i]) + 1
                self._on_token(seq, out, i)

    def _mixed_plan(self) -> tuple[list[_Seq], tuple[int, int]]:
        """The chunking rows the next mixed step carries and its chunk shape (K, C) (see the module docstring)."""
        r, oldest = self.runner, self._chunking[0]
        best: tuple[tuple, list[_Seq], tuple[int, int]] | None = None
        for k, lengths in r.mixed_shapes.items():
            for lo in range(max(0, oldest.slot - k + 1), min(oldest.slot, r.max_batch - k) + 1):
                members = [seq for seq in self._chunking if lo <= seq.slot < lo + k]
                left = [len(seq.chunks) - seq.chunk_from for seq in members]
                for c in lengths:
                    score = (sum(n <= c for n in left), sum(min(n, c) for n in left), -k * c)
                    if best is None or score > best[0]:
                        best = (score, members, (k, c))
        return best[1], best[2]

    def _mixed(self) -> None:
        """One mixed step: the running rows' decode tokens and the next prompt chunk of each chunking row
        `_mixed_plan` picks; after its last chunk a row takes its first sampled token and decodes from the next
        step on."""
        r = self.runner
        group, shape = self._mixed_plan()
        b = bucket_for(self.n_active, r.mixed_buckets)
        rows = []
        for seq in group:
            start, n = seq.chunk_from, len(seq.req.prompt_ids)
            chunk = seq.chunks[start : start + shape[1]]
            rows.append((seq.slot, chunk, start, seq.req.prompt_ids if seq.chunk_fresh else None, n,
                         start + len(chunk) == len(seq.chunks)))
        slots = [seq.slot for seq in group]
        sp = SamplingArrays(*(np.concatenate([a[:b], a[slots]]) for a in self.sp))
        mask = np.concatenate([self.bitmask[:b], self.bitmask[slots]])
        ran = self.positions[:b] >= 0
        out = r.mixed(self.tokens[:b], self.positions[:b], rows, mask, sp, shape)
        self.mixed_steps += 1
        self._take_decoded(out, ran)
        for i, (seq, (_, chunk, start, _, _, final)) in enumerate(zip(group, rows, strict=True)):
            seq.chunk_fresh, seq.chunk_from = False, start + len(chunk)
            seq.written = seq.chunk_from
            if final:
                self._chunking.remove(seq)
                seq.chunks = None
                if not seq.finished:
                    self._on_token(seq, out, b + i)
        self._compact()

    # ---- per-token host work (one active row) -----------------------------------------------------
    def _on_token(self, seq: _Seq, out: SampleOut, i: int) -> None:
        tok = int(out.tokens[i])
        s = seq.req.sampling
        was_planned = bool(seq.planned) and seq.planned[0] == tok
        seq.planned = seq.planned[1:] if was_planned else []
        seq.generated += 1
        seq.out_ids.append(tok)
        self.generated_tokens += 1
        lps = None
        if s.logprobs is not None:
            k = min(s.logprobs, out.top_ids.shape[1])
            top = [(int(t), float(v)) for t, v in zip(out.top_ids[i, :k], out.top_logprobs[i, :k], strict=True)]
            lps = [TokenLogprob(tok, float(out.logprob[i]), top)]
        try:
            text, reason, stop_reason = self._advance(seq, tok)
        except Exception as e:  # noqa: BLE001 - reported on the request, others continue
            self._finish(seq, "error", error=f"{type(e).__name__}: {e}", token_ids=[tok])
            return
        if reason is not None:
            self._finish(seq, reason, stop_reason=stop_reason, text=text, token_ids=[tok], logprobs=lps)
            return
        seq.emit(GenerationOutput(seq.req.request_id, [tok], text, logprobs=lps,
                                  num_prompt_tokens=len(seq.req.prompt_ids), num_generated_tokens=seq.generated,
                                  num_cached_tokens=seq.cached))
        slot = seq.slot
        self.tokens[slot] = tok
        self.positions[slot] = seq.pos
        self.sp.step[slot] = seq.generated
        seq.pos += 1
        forced = self._jump(seq, tok)
        if forced and not seq.finished:  # this row runs [tok, *forced] in an extend step instead of a decode
            self.positions[slot] = -1
            self.sp.step[slot] = seq.generated
            seq.pending = [tok, *forced]
            self._extends.append(seq)
        elif not forced:
            self._pin(seq, tok, plan=not was_planned)  # after a planned run the model samples the next token

    def _pin(self, seq: _Seq, prev: int, plan: bool) -> None:
        """Without jumping: plan the forced tokens after a sampled token `prev` (`plan`), then narrow the row's
        mask (already filled by the grammar) to the next planned token. A plan the grammar does not allow is
        dropped (the model samples under the grammar's mask instead)."""
        c = seq.req.constraint
        jumping = self.jump_forward and seq.req.sampling.logprobs is None
        if jumping or self.tokenizer is None or not hasattr(c, "forced_text"):
            return
        try:
            if plan:
                seq.planned = self._forced_ids(prev, c.forced_text())[: max(seq.req.sampling.max_tokens - seq.generated, 0)]
            if not seq.planned:
                return
            tok, row = seq.planned[0], self.bitmask[seq.slot]
            word, bit = divmod(tok, 32)
            if not 0 <= word < len(row) or not (int(row[word]) >> bit) & 1:
                seq.planned = []
                return
            row.fill(0)
            row[word] = np.int32(np.uint32(1 << bit).view(np.int32))
        except Exception as e:  # noqa: BLE001 - reported on the request, others continue
            self._finish(seq, "error", error=f"{type(e).__name__}: {e}")

    # ---- jump-forward ---------------------------------------------------------------------------
    def _jump(self, seq: _Seq, prev: int, carried: int = 1) -> list[int]:
        """Take the text the grammar forces after `prev` (the last token the model sees) without sampling, as
        `jump_forward.forced_token_ids` tokenises it: at most MAX_JUMP tokens, and no more than fit one
        prefill-program run beside the `carried` tokens that run also carries. Each forced token goes through
        the same constraint, stop and length checks as a sampled one; their text is emitted as one delta and
        the mask is filled for the token after them. May finish the request (an error only ends this one)."""
        c = seq.req.constraint
        if not self.jump_forward or seq.req.sampling.logprobs is not None or not hasattr(c, "forced_text"):
            return []
        room = min(MAX_JUMP, self.runner.length_buckets[-1] - carried, seq.req.sampling.max_tokens - seq.generated,
                   self.runner.max_context - 1 - seq.pos)
        forced: list[int] = []
        pieces: list[str] = []
        try:
            for tok in self._forced_ids(prev, c.forced_text())[: max(room, 0)]:
                if not c.accept_jumped(tok):
                    break
                forced.append(tok)
                seq.generated += 1
                seq.out_ids.append(tok)
                seq.pos += 1
                self.generated_tokens += 1
                self.forced_tokens += 1
                text, reason, stop_reason = self._advance(seq, tok, accepted=True, fill=False)
                pieces.append(text)
                if reason is not None:
                    self._finish(seq, reason, stop_reason=stop_reason, text="".join(pieces), token_ids=forced)
                    return forced
            if forced:
                c.fill_mask(self.bitmask[seq.slot])
        except Exception as e:  # noqa: BLE001 - reported on the request, others continue
            self._finish(seq, "error", error=f"{type(e).__name__}: {e}", text="".join(pieces), token_ids=forced)
            return forced
        if forced:
            seq.emit(GenerationOutput(seq.req.request_id, forced, "".join(pieces),
                                      num_prompt_tokens=len(seq.req.prompt_ids), num_generated_tokens=seq.generated,
                                      num_cached_tokens=seq.cached))
        return forced

    def _forced_ids(self, prev: int, text: str) -> list[int]:
        tok = self.tokenizer
        return forced_token_ids(lambda s: tok.encode(s, add_special_tokens=False), tok.decode, prev, text)

    def _run_extends(self) -> None:
        """One extend step per row that jumped: its last sampled token and the forced tokens, then sample."""
        pending, self._extends = self._extends, []
        for seq in pending:
            if seq.finished or not seq.pending:
                continue
            tokens, seq.pending = seq.pending, None
            slot = seq.slot
            sp1 = SamplingArrays(*(a[slot : slot + 1] for a in self.sp))
            out = self.runner.extend(slot, tokens, seq.pos - len(tokens), self.bitmask[slot : slot + 1], sp1)
            seq.written = seq.pos
            self._on_token(seq, out, 0)
        self._compact()

    def _advance(self, seq: _Seq, tok: int, *, accepted: bool = False,
                 fill: bool = True) -> tuple[str, str | None, str | int | None]:
        """Feed one token through constraint, stop checks and detokeniser; may fill the next mask (`fill`).
        `accepted`: the constraint already took the token (a forced one)."""
        req, s = seq.req, seq.req.sampling
        c = req.constraint
        if c is not None and not accepted:
            # False means the grammar rejected the token: the constraint has given up (and logged
            # it), masks all ones from now on, and the request goes on unconstrained.
            c.accept(tok)
        if tok in seq.stop_ids:
            return self._flush(seq), "stop", tok
        text, stop = seq.stops.push(seq.detok.add(tok) if seq.detok is not None else "")
        if stop is not None:
            return text, "stop", stop
        if c is not None and c.is_terminated():
            return text + self._flush(seq), "stop", None
        if seq.generated >= s.max_tokens or seq.pos >= self.runner.max_context:
            return text + self._flush(seq), "length", None
        if c is not None and fill:
            c.fill_mask(self.bitmask[seq.slot])
        return text, None, None

    @staticmethod
    def _flush(seq: _Seq) -> str:
        text, stop = seq.stops.push(seq.detok.flush() if seq.detok is not None else "")
        return text if stop is not None else text + seq.stops.flush()

    def _finish(self, seq: _Seq, reason: str, *, stop_reason=None, error: str | None = None, text: str = "",
                token_ids: list[int] | None = None, logprobs=None) -> None:
        if seq.finished:
            return
        seq.finished = True
        try:
            seq.emit(GenerationOutput(
                seq.req.request_id, token_ids or [], text, finished=True, finish_reason=reason,
                stop_reason=stop_reason, error=error, logprobs=logprobs,
                num_prompt_tokens=len(seq.req.prompt_ids), num_generated_tokens=seq.generated,
                num_cached_tokens=seq.cached))
        finally:
            if seq.slot >= 0:
                self.positions[seq.slot] = -1
                self.bitmask[seq.slot].fill(-1)
                if self.prefixes is not None:  # the row keeps what was written: the prompt and fed-back outputs
                    self.prefixes.record(seq.slot, (list(seq.req.prompt_ids) + seq.out_ids)[: seq.written])

    def _compact(self) -> None:
        """Drop finished rows, moving the highest active rows into the holes (device rows included)."""
        n = self.n_active
        i = 0
        while i < n:
            seq = self.slots[i]
            if seq is not None and not seq.finished:
                i += 1
                continue
            self.slots[i] = None
            last = n - 1
            while last > i and (self.slots[last] is None or self.slots[last].finished):
                self.slots[last] = None
                last -= 1
            if last > i:
                mover = self.slots[last]
                # the mover holds nothing at or past its next position; the finished row, its record
                if self.prefixes is not None:  # keep the finished row's prefix: it goes up to `last`
                    self.runner.swap(last, i, extent=max(mover.pos, self.prefixes.length(i)))
                    self.prefixes.swapped(last, i)
                else:
                    self.runner.move(last, i, extent=mover.pos)
                for a in (self.tokens, self.positions, self.bitmask, *self.sp):
                    a[i] = a[last]
                self.positions[last] = -1
                self.bitmask[last].fill(-1)
                self.slots[i], self.slots[last] = mover, None
                mover.slot = i
                n = last
                i += 1
            else:
                n = i
        self.n_active = n
