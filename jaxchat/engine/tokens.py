"""Token handling after a step, on the host: grammar accept, stop checks, detokenising, jump-forward, emitting.

Contract (`TokenHandler(tokenizer, max_context, max_jump=MAX_JUMP, jump_forward=True)`, one per scheduler):
- `take(seq, out, i)`: row i of a step's `sampler.SampleOut` is the request's next token: it goes through the
  constraint (`accept`), the stop ids, the detokeniser and stop strings, `is_terminated()`, `max_tokens` and
  the context; it is emitted as a `GenerationOutput` delta (with its logprobs when asked), or the request is
  finished. Otherwise the next mask is filled and the request's next step is set up: `pending` = [token,
  *forced] (jump-forward: the text the grammar forces after it, taken without sampling; the token left out
  when it already runs, fed from the device: `seq.fed`), `count_from` = the position after the sampled token.
- `start(seq)`: at admission (after the prompt, or a recompute after a preemption): text the grammar forces
  first joins the pending tokens (not after a recompute: it was taken before).
- Jump-forward (`jump_forward`, for constraints that declare `jumps`, requests without logprobs): the forced
  tokens, as the tokenizer spells them after the previous token (`jump_forward.forced_token_ids`), less the
  last, at most `max_jump` (and what `max_tokens` and the context leave), each checked like a sampled token
  and emitted as one delta, counted in `forced_tokens`.
- Without jump-forward (off, or a request with logprobs) the same tokens are planned and taken one per step,
  the mask narrowed to each (`pin`), then the model samples the token after them under the grammar's mask:
  the model never sees forced text spelled in pieces it was not trained on.
- `finish(seq, reason, ...)` emits the last delta (finished=True) once; the scheduler frees what the request
  held. An exception in one request's host work finishes only that request ("error").
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxchat.engine.jump_forward import forced_token_ids
from jaxchat.engine.plan import sampling_values
from jaxchat.engine.sequence import Sequence
from jaxchat.engine.tokenizer import IncrementalDetokenizer, StopStringMatcher
from jaxchat.engine.types import GenerationOutput, TokenLogprob

MAX_JUMP = 64  # forced tokens taken at once (more come after the next sampled token)


class TokenHandler:
    def __init__(self, tokenizer: Any, max_context: int, max_jump: int = MAX_JUMP, jump_forward: bool = True) -> None:
        self.tokenizer, self.max_context, self.max_jump = tokenizer, max_context, max_jump
        self.jump_forward = jump_forward and tokenizer is not None
        self.generated_tokens = 0
        self.forced_tokens = 0

    # ---- sampled tokens --------------------------------------------------------------------------------
    def take(self, seq: Sequence, out: Any, i: int) -> None:
        """Row i of `out` is the request's next token (`take_all` of one)."""
        self.take_all([(seq, out, [i])])

    def take_all(self, rows: list[tuple[Sequence, Any, list[int]]]) -> None:
        """Each (request, out, indices): rows `indices` of `out` are the request's next tokens, in order (several
        after a verified draft). Every token is accepted and checked first (a token that ends the request drops
        those after it), then the next masks of all the requests that go on are filled in one batch
        (`fill_masks`), then each request's next step is set up (jump-forward, planned tokens)."""
        going_on = []
        for seq, out, indices in rows:
            taken = None
            for i in indices:
                taken = self._take_token(seq, out, i)
                if taken is None:
                    break
            if taken is not None:
                going_on.append(taken)
        fill_masks([seq for seq, _, _ in going_on if seq.req.constraint is not None], self.finish)
        for seq, tok, was_planned in going_on:
            if seq.finished:
                continue
            seq.pending, seq.count_from = ([] if seq.fed else [tok]), seq.position + 1
            seq.fed = False
            forced = self.jump(seq, tok)
            seq.pending += forced
            if not forced and not seq.finished:
                self.pin(seq, tok, plan=not was_planned)  # after a planned run the model samples the next token

    def _take_token(self, seq: Sequence, out: Any, i: int) -> tuple[Sequence, int, bool] | None:
        """Accept, check and emit one sampled token (the mask not filled yet); None when it ended the request."""
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
            text, reason, stop_reason = self.advance(seq, tok, fill=False)
        except Exception as e:  # noqa: BLE001 - reported on the request, others continue
            self.finish(seq, "error", error=f"{type(e).__name__}: {e}", token_ids=[tok])
            return None
        if reason is not None:
            self.finish(seq, reason, stop_reason=stop_reason, text=text, token_ids=[tok], logprobs=lps)
            return None
        seq.emit(GenerationOutput(seq.req.request_id, [tok], text, logprobs=lps,
                                  num_prompt_tokens=len(seq.prompt), num_generated_tokens=seq.generated,
                                  num_cached_tokens=seq.cached))
        return seq, tok, was_planned

    def open(self, seq: Sequence) -> bool:
        """A request's first admission: check its prompt, make its detokeniser and stop matcher, its sampling values
        and its first mask. False (the request finished with an error) when it cannot run."""
        req = seq.req
        try:
            n = len(req.prompt_ids)
            if n == 0:
                raise ValueError("prompt_ids is empty")
            if n >= self.max_context:
                raise ValueError(f"prompt_ids: {n} tokens leave no room in the context of {self.max_context}")
            if self.tokenizer is not None:  # without a tokenizer (random-weight benchmarks) there is no text
                seq.detok = IncrementalDetokenizer(self.tokenizer, req.prompt_ids)
            seq.stops = StopStringMatcher(req.sampling.stop)
            seq.sampling = sampling_values(req)
            if req.constraint is not None:
                req.constraint.fill_mask(seq.mask)
        except Exception as e:  # noqa: BLE001 - reported on the request, others continue
            self.finish(seq, "error", error=f"{type(e).__name__}: {e}")
            return False
        seq.started = True
        return True

    def start(self, seq: Sequence, recompute: bool) -> None:
        """Set up an admitted request's first step: its pending tokens from `computed` on (and, for a new
        request, the text its grammar forces first)."""
        seq.pending, seq.count_from = seq.tokens[seq.computed:], len(seq.prompt)
        if recompute:
            return
        forced = self.jump(seq, seq.prompt[-1])
        seq.pending += forced
        if not forced and not seq.finished:
            self.pin(seq, seq.prompt[-1], plan=True)

    # ---- the checks -----------------------------------------------------------------------------------
    def advance(self, seq: Sequence, tok: int, *, accepted: bool = False,
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
            return self.flush(seq), "stop", tok
        text, stop = seq.stops.push(seq.detok.add(tok) if seq.detok is not None else "")
        if stop is not None:
            return text, "stop", stop
        if c is not None and c.is_terminated():
            return text + self.flush(seq), "stop", None
        if seq.generated >= s.max_tokens or seq.position >= self.max_context:
            return text + self.flush(seq), "length", None
        if c is not None and fill:
            c.fill_mask(seq.mask)
        return text, None, None

    @staticmethod
    def flush(seq: Sequence) -> str:
        text, stop = seq.stops.push(seq.detok.flush() if seq.detok is not None else "")
        return text if stop is not None else text + seq.stops.flush()

    # ---- forced text ------------------------------------------------------------------------------------
    def jump(self, seq: Sequence, prev: int) -> list[int]:
        """Take the text the grammar forces after `prev` without sampling (see the module docstring): at most
        `max_jump` tokens. May finish the request."""
        c = seq.req.constraint
        if not self.jump_forward or seq.req.sampling.logprobs is not None or c is None or not c.jumps:
            return []
        room = min(self.max_jump, seq.req.sampling.max_tokens - seq.generated,
                   self.max_context - 1 - seq.position)
        forced: list[int] = []
        pieces: list[str] = []
        try:
            for tok in self.forced_ids(prev, c.forced_text())[: max(room, 0)]:
                if not c.accept_jumped(tok):
                    break
                forced.append(tok)
                seq.generated += 1
                seq.out_ids.append(tok)
                self.generated_tokens += 1
                self.forced_tokens += 1
                text, reason, stop_reason = self.advance(seq, tok, accepted=True, fill=False)
                pieces.append(text)
                if reason is not None:
                    self.finish(seq, reason, stop_reason=stop_reason, text="".join(pieces), token_ids=forced)
                    return forced
            if forced:
                c.fill_mask(seq.mask)
        except Exception as e:  # noqa: BLE001 - reported on the request, others continue
            self.finish(seq, "error", error=f"{type(e).__name__}: {e}", text="".join(pieces), token_ids=forced)
            return forced
        if forced:
            seq.emit(GenerationOutput(seq.req.request_id, forced, "".join(pieces),
                                      num_prompt_tokens=len(seq.prompt), num_generated_tokens=seq.generated,
                                      num_cached_tokens=seq.cached))
        return forced

    def pin(self, seq: Sequence, prev: int, plan: bool) -> None:
        """Without jumping: plan the forced tokens after a sampled token `prev` (`plan`), then narrow the row's
        mask (already filled by the grammar) to the next planned token. A plan the grammar does not allow is
        dropped (the model samples under the grammar's mask instead)."""
        c = seq.req.constraint
        jumping = self.jump_forward and seq.req.sampling.logprobs is None
        if jumping or self.tokenizer is None or c is None or not c.jumps:
            return
        try:
            if plan:
                left = max(seq.req.sampling.max_tokens - seq.generated, 0)
                seq.planned = self.forced_ids(prev, c.forced_text())[:left]
            if not seq.planned:
                return
            tok, row = seq.planned[0], seq.mask
            word, bit = divmod(tok, 32)
            if not 0 <= word < len(row) or not (int(row[word]) >> bit) & 1:
                seq.planned = []
                return
            row.fill(0)
            row[word] = np.uint32(1 << bit).view(np.int32)
        except Exception as e:  # noqa: BLE001 - reported on the request, others continue
            self.finish(seq, "error", error=f"{type(e).__name__}: {e}")

    def forced_ids(self, prev: int, text: str) -> list[int]:
        tok = self.tokenizer
        return forced_token_ids(lambda s: tok.encode(s, add_special_tokens=False), tok.decode, prev, text)

    # ---- the end ---------------------------------------------------------------------------------------
    def finish(self, seq: Sequence, reason: str, *, stop_reason=None, error: str | None = None, text: str = "",
               token_ids: list[int] | None = None, logprobs=None) -> None:
        if seq.finished:
            return
        seq.finished = True
        seq.emit(GenerationOutput(
            seq.req.request_id, token_ids or [], text, finished=True, finish_reason=reason,
            stop_reason=stop_reason, error=error, logprobs=logprobs,
            num_prompt_tokens=len(seq.prompt), num_generated_tokens=seq.generated,
            num_cached_tokens=seq.cached))


def fill_masks(seqs: list[Sequence], on_error) -> None:
    """Fill the next mask of each request (`seq.mask`) from its constraint: constraints of a type that declares a
    `batch_fill(constraints, rows)` (`jaxchat.constrain`'s grammar constraints: one batched, threaded xgrammar
    call) are filled together, the others one by one. A failure ends only the requests it concerns
    (`on_error(seq, "error", error=...)`)."""
    groups: dict[type, list[Sequence]] = {}
    for seq in seqs:
        groups.setdefault(type(seq.req.constraint), []).append(seq)
    for kind, group in groups.items():
        batch = kind.batch_fill
        if batch is not None and len(group) > 1:
            try:
                batch([seq.req.constraint for seq in group], [seq.mask for seq in group])
                continue
            except Exception:  # noqa: BLE001 - fall back to one by one, so only the failing request ends
                pass
        for seq in group:
            try:
                seq.req.constraint.fill_mask(seq.mask)
            except Exception as e:  # noqa: BLE001 - reported on the request, others continue
                on_error(seq, "error", error=f"{type(e).__name__}: {e}")
