"""Per-request constraints the engine's host loop drives (the `jaxchat.engine.types.Constraint` protocol).

Contract:
- `GrammarConstraint`: one xgrammar matcher per request. `start(prefill)` feeds the text the prompt
  already opened (Harmony's leading `assistant` role is dropped); `fill_mask(row)` writes the
  allowed-token bitmask into `row` (numpy int32, the layout of `jaxchat.bitmask`; xgrammar writes
  it in place, no copy); `GrammarConstraint.fill_masks(constraints, rows)` fills several at once (one batched
  xgrammar call over its thread pool: the engine's host loop uses it); `accept(token)` advances (False when the grammar rejected the token);
  `accept_forced(token)` advances by a token the model was made to emit; `is_terminated()`;
  `fresh_matcher()`: a new xgrammar matcher of the same grammar and stop tokens (benchmarks compare with it).
- Jump-forward: `forced_text()` is the continuation the grammar admits as the only one (xgrammar's
  jump-forward string); `accept_jumped(token)` advances by one token of it, or returns False and leaves
  the state as it was when the grammar does not take that token id.
- Reasoning switch: when the grammar has no reasoning block but reasoning starts anyway (the
  prefill opens it, or a forced token opens it), the constraint switches to the precompiled
  grammar that has one and replays the prefill and the accepted tokens into it.
- `give_up(reason)`: after any rejection the constraint logs `Constrained decoding disabled for
  this request: <reason>` once and stops masking (every token allowed); the request completes.
- Marker guard: a single-token marker (`</tool_call>`, `<|call|>`, ...) is masked wherever plain
  text is also allowed, so markers appear only where the grammar needs them structurally. This is
  a second line: the grammar itself keeps markers, spelled out or single tokens, out of free text
  and strings (`excludes`, see `tags.string_excludes`).
- Speculative decoding: `draft_masks(drafts, masks)` fills the mask at each draft position (the matcher
  advanced through the drafts it admits, then rolled back: xgrammar's rollback) and says how many it admits.
- `TokenBanConstraint` (`token_ban_constraint`): a fixed mask with some tokens banned, no grammar
  (tool_choice "none" when the tool opener is a single token).
"""

from __future__ import annotations

import logging

import numpy as np
import xgrammar as xgr

from jaxchat.bitmask import mask_words

log = logging.getLogger("jaxchat")


_BATCH_MATCHER: list = []


def _batch_matcher():
    """One xgrammar batch matcher per process (a thread pool of half the machine's cores)."""
    if not _BATCH_MATCHER:
        _BATCH_MATCHER.append(xgr.BatchGrammarMatcher())
    return _BATCH_MATCHER[0]


class GrammarConstraint:
    """An xgrammar-backed constraint for one request."""

    # the engine's `Constraint` protocol: what it offers beyond fill_mask / accept / is_terminated
    jumps = True  # forced_text, accept_jumped
    drafts = True  # draft_masks

    def __init__(self, compiled, *, vocab_size: int, role: str = "", reasoning_start: str = "",
                 reasoning_compiled=None, text_stop_ids=(), stop_token_ids=None, guard_ids=(),
                 late_guard_ids=(), canary_id=None, opener_ids=(), end_ids=()):
        self._compiled = compiled
        self._reasoning_compiled = reasoning_compiled  # the grammar to switch to, or None
        self._stops = stop_token_ids
        self._matcher = self._new_matcher(compiled)
        self.vocab_size = vocab_size
        self.words = mask_words(vocab_size)
        self.role = role
        self.reasoning_start = reasoning_start
        self.text_stop_ids = frozenset(text_stop_ids)
        self.prefill = ""
        self.history: list[int] = []
        self.disabled = False
        self.switched = False
        self._inject_rejection = False
        self._given_up_reason = ""
        self.guard_ids = tuple(guard_ids)
        self.late_guard_ids = tuple(late_guard_ids)
        self.canary_id = canary_id
        self.opener_ids = tuple(opener_ids)  # the tool opener: free text may contain it, strings not
        self.end_ids = tuple(end_ids)  # end-of-turn tokens: allowed where free text may end

    def fresh_matcher(self) -> xgr.GrammarMatcher:
        """A new xgrammar matcher of this constraint's grammar and stop tokens, at its start."""
        return self._new_matcher(self._compiled)

    def _new_matcher(self, compiled):
        if self._stops is None:
            return xgr.GrammarMatcher(compiled)
        return xgr.GrammarMatcher(compiled, override_stop_tokens=list(self._stops))

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, prefill: str = "") -> None:
        """Feed the prefill (the part of the prompt the output continues) into the matcher."""
        if self.role and prefill.startswith(self.role):
            prefill = prefill[len(self.role):]
        self.prefill = prefill
        if self.reasoning_start and prefill.startswith(self.reasoning_start) and self._can_switch():
            self._switch()
            return
        if prefill and not self._matcher.accept_string(prefill.encode()):
            self.give_up(f"the prefill {prefill!r} does not match the grammar")

    def inject_rejection(self) -> None:
        """Test hook: the next `accept` behaves as if the grammar rejected the token."""
        self._inject_rejection = True

    def give_up(self, reason: str) -> None:
        """Stop constraining this request (logged once)."""
        if not self.disabled:
            self.disabled = True
            self._given_up_reason = reason
            log.warning("Constrained decoding disabled for this request: %s", reason)

    # -- the Constraint protocol ------------------------------------------------------------------

    def fill_mask(self, row: np.ndarray) -> None:
        """Write the next-token bitmask into `row` (int32, at least ceil(V/32) words)."""
        if self.disabled or self._matcher.is_terminated():
            row.fill(-1)
            return
        view = row[: self.words].reshape(1, self.words)
        self._matcher.fill_next_token_bitmask(view)
        if row.shape[0] > self.words:
            row[self.words:] = 0
        if self.canary_id is not None and (self.guard_ids or self.late_guard_ids or self.opener_ids):
            self._guard(row.view(np.uint32))

    @classmethod
    def fill_masks(cls, constraints: list[GrammarConstraint], rows: list[np.ndarray]) -> None:
        """`fill_mask` of several constraints at once: the live matchers' masks in one batched xgrammar call
        (its threads), then each row's own finishing (padding words, marker guard)."""
        live = [(c, row) for c, row in zip(constraints, rows, strict=True)
                if not c.disabled and not c._matcher.is_terminated()]
        for c, row in zip(constraints, rows, strict=True):
            if c.disabled or c._matcher.is_terminated():
                row.fill(-1)
        if not live:
            return
        words = live[0][0].words
        if len(live) == 1 or any(c.words != words for c, _ in live):
            for c, row in live:
                c.fill_mask(row)
            return
        masks = np.empty((len(live), words), np.int32)
        _batch_matcher().batch_fill_next_token_bitmask([c._matcher for c, _ in live], masks)
        for (c, row), mask in zip(live, masks, strict=True):
            row[:words] = mask
            if row.shape[0] > words:
                row[words:] = 0
            if c.canary_id is not None and (c.guard_ids or c.late_guard_ids or c.opener_ids):
                c._guard(row.view(np.uint32))

    batch_fill = fill_masks  # the engine fills several rows' masks in one call

    def draft_masks(self, drafts: list[int], masks: np.ndarray) -> int:
        """Speculative decoding: the masks of the next token and of the token after each draft token, as the
        grammar would fill them after accepting the drafts before it (`masks[j]`, j = 0 .. n), where n is how
        many drafts the grammar admits in a row (a draft it rejects ends the draft there). The matcher is rolled
        back: its state is as before the call."""
        self.fill_mask(masks[0])
        if self.disabled or self._matcher.is_terminated():
            masks[1:].fill(-1)
            return len(drafts)
        taken = 0
        for tok in drafts:
            if not self._matcher.accept_token(int(tok)):
                break
            taken += 1
            self.fill_mask(masks[taken])
        if taken:
            self._matcher.rollback(taken)
        return taken

    def _guard(self, bits: np.ndarray) -> None:
        """Marker guard: where plain text is allowed (the canary token is), a marker token could only
        be text inside a string or free text, so it is masked out (see tags.guarded_markers). The
        tool opener stays allowed in free text, recognised by the turn being able to end there."""
        c = self.canary_id
        if c is None or not (bits[c >> 5] >> np.uint32(c & 31)) & 1:
            return
        late = self.late_guard_ids if (self.history or self.prefill) else ()
        in_string = not any((bits[e >> 5] >> np.uint32(e & 31)) & 1 for e in self.end_ids)
        for t in (*self.guard_ids, *late, *(self.opener_ids if in_string else ())):
            bits[t >> 5] &= np.uint32(~(1 << (t & 31)) & 0xFFFFFFFF)

    def accept(self, token: int) -> bool:
        self.history.append(int(token))
        if self.disabled:
            return True
        if self._inject_rejection:
            self._inject_rejection = False
            self.give_up(f"token {token} rejected (injected by a test)")
            return False
        if self._matcher.accept_token(int(token)):
            return True
        self.give_up(f"token {token} rejected by the grammar after {len(self.history) - 1} tokens")
        return False

    def accept_forced(self, token: int) -> bool:
        """Advance by a token the model is made to emit; switches to the reasoning grammar if needed."""
        self.history.append(int(token))
        if self.disabled:
            return True
        if self._matcher.accept_token(int(token)):
            return True
        if self._can_switch() and self._switch():
            return True
        self.give_up(f"forced token {token} rejected by the grammar")
        return False

    def forced_text(self) -> str:
        """The text the grammar admits as the only continuation from here ("" when there is a choice, or
        when the constraint has given up): jump-forward appends it without sampling."""
        if self.disabled or self._matcher.is_terminated():
            return ""
        return self._matcher.find_jump_forward_string()

    def accept_jumped(self, token: int) -> bool:
        """Advance by a token of `forced_text()`'s tokenisation; False (state unchanged, no give-up) when the
        grammar does not take this token id, so the jump stops before it."""
        if self.disabled or not self._matcher.accept_token(int(token)):
            return False
        self.history.append(int(token))
        return True

    def is_terminated(self) -> bool:
        if self.disabled:
            return False
        if self._matcher.is_terminated():
            return True
        return bool(self.history) and self.history[-1] in self.text_stop_ids and self._matcher.is_completed()

    # -- reasoning switch -------------------------------------------------------------------------

    def _can_switch(self) -> bool:
        return self._reasoning_compiled is not None and not self.switched

    def _switch(self) -> bool:
        """Replay the prefill and the history into the grammar that allows reasoning."""
        self.switched = True
        matcher = self._new_matcher(self._reasoning_compiled)
        ok = not self.prefill or matcher.accept_string(self.prefill.encode())
        ok = ok and all(matcher.accept_token(t) for t in self.history)
        if not ok:
            self.give_up("reasoning started but the output does not match the grammar with reasoning")
            return False
        self._matcher = matcher
        self._compiled = self._reasoning_compiled
        log.info("Constrained decoding switched to the grammar with reasoning")
        return True

    @property
    def matcher(self):
        return self._matcher

    @property
    def given_up_reason(self) -> str:
        return self._given_up_reason


class TokenBanConstraint:
    """A fixed mask: every token allowed except `banned`."""

    jumps = False  # the engine's `Constraint` protocol: nothing is forced
    drafts = True  # draft_masks
    batch_fill = None

    def __init__(self, vocab_size: int, banned):
        self.vocab_size = vocab_size
        self.words = mask_words(vocab_size)
        bits = np.ones(self.words * 32, dtype=bool)
        bits[vocab_size:] = False
        bits[list(banned)] = False
        self.banned = tuple(banned)
        self.mask = np.packbits(bits, bitorder="little").view(np.int32).copy()

    def start(self, prefill: str = "") -> None:
        pass

    def fill_mask(self, row: np.ndarray) -> None:
        row[: self.words] = self.mask
        if row.shape[0] > self.words:
            row[self.words:] = 0

    def accept(self, token: int) -> bool:
        return int(token) not in self.banned

    def accept_forced(self, token: int) -> bool:
        return True

    def draft_masks(self, drafts: list[int], masks: np.ndarray) -> int:
        """The same fixed mask at every position; a banned draft token ends the draft."""
        taken = next((i for i, t in enumerate(drafts) if int(t) in self.banned), len(drafts))
        for row in masks[:taken + 1]:
            self.fill_mask(row)
        return taken

    def is_terminated(self) -> bool:
        return False


def token_ban_constraint(vocab_size: int, token_id: int) -> TokenBanConstraint:
    """The tool_choice "none" constraint when the tool opener is the single token `token_id`."""
    return TokenBanConstraint(vocab_size, [token_id])
