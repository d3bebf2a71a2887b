"""Speculative decoding with prompt-lookup drafts, verified in the ragged step under the grammar.

Contract (`Speculator(k_max, max_tokens)`, one per scheduler; `k_max` 0 turns it off):
- `start(seq)` at a request's first admission: a request drafts unless it has a repetition, presence or
  frequency penalty or asks for logprobs, or its constraint does not declare draft masks (`drafts`); the reason
  is logged (debug) and the request decodes as usual.
- `waits(seq, running)`: whether a drafting row whose sampled token is still on the device needs that token on
  the host before the next step is planned (its drafts follow it): while it is copying (the tail of its known
  tokens occurred before) and a step of `running` rows has room for drafts (at most `max_rows`, max_tokens //
  4). The scheduler then takes the in-flight step's tokens before planning (that step is not overlapped); rows
  writing new text keep the overlapped loop. `decoded(seq)`: a token taken without drafts (a paused row's
  pause counts down).
- `draft(rows, pool)`: after the scheduler planned a step of at most `max_rows` rows, each drafting row that
  runs exactly its last sampled token gets up to k drafts (`drafts.NgramIndex` over its tokens; k from its
  `drafts.DraftLength`, at most what `max_tokens` and the context leave, and what keeps the step within
  `limit` tokens, the largest verify step compiled so far: `max_tokens` once all are). A row with planned
  forced tokens (jump-forward off: its masks are pinned to them) does not draft. Its constraint fills the mask
  of every position (`draft_masks`: the grammar advanced through the drafts, then rolled back; a draft token
  it rejects ends the draft there). The row's pages are extended to hold the drafts (free or evictable pages only: no preemption for a draft). A row
  with drafts samples at every position (`RowInput.drafts`).
- `verified(seq, row, tokens)`: the tokens sampled at the row's positions; the drafts are accepted while each
  equals the token sampled before it (greedy: the argmax; with temperature the sampler's rejection step, see
  `sampler`), and the token after the last accepted draft is the row's next one. Returns how many of `tokens`
  are the request's (accepted drafts + 1) and rewinds `seq.computed` past the rejected drafts (their K/V is
  overwritten when those positions are run again). Counts `drafted` and `accepted` tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence as Seq

import numpy as np

from jaxchat.engine.drafts import DraftLength, NgramIndex
from jaxchat.engine.plan import RowInput
from jaxchat.engine.sequence import Sequence

log = logging.getLogger(__name__)


class Speculator:
    def __init__(self, k_max: int, max_tokens: int, max_context: int, mask_words: int) -> None:
        self.k_max, self.max_tokens, self.max_context, self.mask_words = k_max, max_tokens, max_context, mask_words
        self.limit = max_tokens  # the largest verify step compiled so far (the scheduler sets it each step)
        self.drafted = 0
        self.accepted = 0

    @property
    def max_rows(self) -> int:
        """The most rows a step with drafts runs: each drafting row needs room for a few drafts (2 rows in a CPU
        verify step of 8 tokens, 16 in one of 64)."""
        return self.limit // 4

    @property
    def on(self) -> bool:
        """Whether requests draft at all (a verify program exists)."""
        return self.k_max > 0 and self.max_tokens > 1

    def start(self, seq: Sequence) -> None:
        if not self.on:
            return
        s, c = seq.req.sampling, seq.req.constraint
        why = None
        if s.repetition_penalty != 1.0 or s.presence_penalty or s.frequency_penalty:
            why = "penalties (the counts a draft would need are not kept per position)"
        elif s.logprobs is not None:
            why = "logprobs are asked for"
        elif c is not None and not c.drafts:
            why = f"its constraint ({type(c).__name__}) cannot fill masks ahead"
        if why is not None:
            log.debug("request %s decodes without drafts: %s", seq.req.request_id, why)
            return
        seq.drafts = (NgramIndex(), DraftLength(self.k_max))

    def waits(self, seq: Sequence, running: int) -> bool:
        if seq.drafts is None:
            return False
        index, length = seq.drafts
        if not length.active or running > self.max_rows:
            return False  # no room for drafts beside the other rows' tokens
        return bool(index.propose(seq.tokens, 1))

    def draft(self, rows: list, pool) -> list:
        """The planned rows with drafts added where they can be (see the module docstring)."""
        if not self.on or self.limit <= 1 or not any(row.seq.drafts is not None for row in rows):
            return rows
        used = sum(len(row.input.tokens) for row in rows)
        if used >= self.limit or len(rows) > self.max_rows:
            return rows
        out = []
        for planned in rows:
            seq, row, epoch = planned
            if (seq.drafts is None or row.feed or row.drafts or len(row.tokens) != 1 or not row.samples
                    or seq.planned):  # planned forced tokens: its next masks are pinned to them, not drafted
                out.append(planned)
                continue
            index, length = seq.drafts
            if not length.active:
                out.append(planned)
                continue
            s = seq.req.sampling
            room = min(length.k, s.max_tokens - seq.generated - 1, self.max_context - 1 - row.start - 1,
                       self.limit - used)
            drafts = index.propose(seq.tokens, room) if room > 0 else []
            if drafts and seq.req.constraint is not None:
                masks = np.empty((len(drafts) + 1, self.mask_words), np.int32)
                taken = seq.req.constraint.draft_masks(drafts, masks)
                drafts, seq.draft_masks = drafts[:taken], masks[:taken + 1]
            if drafts:
                need = pool.pages_for(row.start + 1 + len(drafts)) - len(seq.pages)
                got = pool.allocate(need) if need > 0 else []
                if got is None:
                    drafts = []
                else:
                    seq.pages += got
            if not drafts:
                out.append(planned)
                continue
            used += len(drafts)
            out.append(planned._replace(input=row._replace(tokens=[*row.tokens, *drafts], pages=list(seq.pages),
                                                           drafts=len(drafts))))
        return out

    def decoded(self, seq: Sequence) -> None:
        """A token of `seq` was taken from a step without drafts for it: a paused row counts down its pause."""
        if seq.drafts is not None and not seq.drafts[1].active:
            seq.drafts[1].tick()

    def verified(self, seq: Sequence, row: RowInput, tokens: Seq[int]) -> int:
        drafts = row.tokens[len(row.tokens) - row.drafts:]
        taken = 0
        while taken < len(drafts) and int(tokens[taken]) == int(drafts[taken]):
            taken += 1
        seq.computed -= len(drafts) - taken
        seq.drafts[1].verified(len(drafts), taken)
        self.drafted += len(drafts)
        self.accepted += taken
        return taken + 1
