"""A reply that opens with a call envelope goes on in the chat format's own call syntax.

Contract: `restarted(engine, request, plan)` yields the engine's `GenerationOutput` deltas for `request`,
except when the reply opens with a call envelope (`jaxchat.chat.envelopes`: fenced or bare JSON naming a
declared tool, at the start of a line after blank lines and spaces or tabs, where the parser reads one):
  - while the opening is undecided its outputs are held back (the parser would hold that text back too);
  - once its first call is decided (its arguments object opened), that generation is aborted and another
    runs from the prompt followed by the format's own opening of that call (`RestartPlan.opening(name)`,
    e.g. `<tool_call>\\n{"name": "NAME", "arguments":`, its trailing space left for the model to write as part
    of its next token): its first delta is the opening's text and tokens, then its own deltas, with
    `num_generated_tokens` counting the opening, `num_prompt_tokens` the original prompt's, `num_cached_tokens`
    the first generation's (the second finds the prompt's pages the first just computed), and `max_tokens`
    what the opening leaves; its grammar constraint (`RestartPlan.constraint`, awaited: the pipeline's is
    the request's under tool_choice "required", calls only, compiled on the grammar engine's threads, never
    on the event loop; `RestartPlan.prepare` starts that compile as soon as the reply begins like an
    envelope, so it is usually ready when the call is decided) starts after the opening, so
    the call and any that follow are the native grammar's and nothing but calls follows (the model chose to
    call; left free text after its calls, the small model writes stray end markers and the same call again
    as bare JSON). Each call after its first complete one is held back until it is complete; one that
    repeats an earlier call of the reply (same name, equal arguments) ends the reply before it (finish
    "stop"; the generation is aborted): in its own syntax a small model that repeats a call under greedy
    decoding goes on repeating it until `max_tokens`. Needs the format's call markers
    (`RestartPlan.call_markers`). Usage counts the reply as sent: the opening and the tokens after it, not
    the envelope the first generation wrote nor the tokens of a dropped repeat;
  - an opening that proves not to be an envelope, a reply that ends before it is decided, or a restart that
    cannot be as if the model wrote the opening (it does not fit in `max_tokens`, the prompt with it does
    not fit the KV pool (`RestartPlan.fits`), a stop string or stop token of the request lies in it or
    overlaps its end, its grammar cannot be built): the held deltas are released unchanged and the rest
    follows as the engine gives it.
Why: a small model that writes its first call as fenced JSON writes one call per reply in that form; put
in its own syntax it goes on as it does there (several calls when the question asks for several). What
it chose (the tool) is kept; only the spelling of the opening changes, and the envelope's text was never
sent, so streams and the prefix property are as if the model had written the native call.
Only for requests without logprobs (the opening's tokens have none) whose reply starts the content.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from jaxchat.chat.envelopes import read_envelope
from jaxchat.chat.segments import partial_marker_length
from jaxchat.engine.types import GenerationOutput, GenerationRequest

__all__ = ["RestartPlan", "restarted"]

_WHITESPACE = " \t\r\n"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPlan:
    names: frozenset[str]  # the callable tools' names
    opening: Callable[[str], str | None]  # the format's own opening of a call of that tool
    tokenize: Callable[[str], list[int]]
    constraint: Callable[[str], Awaitable[Any]]  # the request's constraint, started after the given opening
    call_markers: tuple[str, str] = ("", "")  # the format's call start and end markers (repeats: none without)
    fits: Callable[[int], bool] = lambda tokens: True  # whether a prompt of that many tokens fits the KV pool
    prepare: Callable[[], Awaitable[None]] | None = None  # compiles `constraint`'s grammar ahead (an envelope begins)


async def restarted(engine, request: GenerationRequest, plan: RestartPlan) -> AsyncIterator[GenerationOutput]:
    deciding, held, text, cached = True, [], "", 0  # deciding: the reply may still open with an envelope
    first = engine.generate(request)
    preparing = None  # the restart's grammar compile, started once the reply begins like an envelope
    try:
        async for out in first:
            if not deciding:
                yield out
                continue
            held.append(out)
            text += out.text
            cached = max(cached, out.num_cached_tokens)
            body = _envelope_body(text)
            read = read_envelope(body, plan.names, partial=True) if body else None
            if preparing is None and plan.prepare is not None and read is not None and not read.rejected:
                preparing = asyncio.ensure_future(plan.prepare())
            decided = read is not None and read.calls and not out.finished
            restart = await _restart(request, plan, read.calls[0].name) if decided else None
            if restart is not None:
                await first.aclose()
                async for later in _continue(engine, request, plan, *restart, out.request_id, cached):
                    yield later
                return
            if out.finished or body is None or (read is not None and (read.rejected or read.calls)):
                for kept in held:
                    yield kept
                deciding, held = False, []
    finally:
        await first.aclose()
        if preparing is not None and not preparing.done():
            preparing.cancel()  # the compile itself goes on on its thread and is cached


def _envelope_body(text: str) -> str | None:
    """The reply after its leading whitespace, where the parser would look for an envelope; None when that
    whitespace rules one out (the envelope would not start a line after spaces or tabs)."""
    body = text.lstrip(_WHITESPACE)
    last_line = text[: len(text) - len(body)].rsplit("\n", 1)[-1]
    return None if body and last_line.strip(" \t") else body


async def _restart(request: GenerationRequest, plan: RestartPlan, name: str) -> tuple[str, list[int], Any] | None:
    opening = plan.opening(name)
    if opening is None:
        return None
    # A tokenizer folds a space into the token after it (` {"`): a prompt ending in a lone space token is one
    # the model never saw (it then writes nonsense), so the model writes that space itself.
    opening = opening.rstrip(" ")
    ids = plan.tokenize(opening)
    sampling = request.sampling
    if len(ids) >= sampling.max_tokens or not plan.fits(len(request.prompt_ids) + len(ids)):
        return None
    if _stops_in(opening, sampling.stop) or set(ids) & set(sampling.stop_token_ids):
        return None
    try:
        constraint = await plan.constraint(opening)
    except (RuntimeError, ValueError) as exc:  # the grammar after the opening cannot be built: no restart
        log.warning("no native restart: the grammar after %r: %s", opening, exc)
        return None
    return opening, ids, constraint


def _stops_in(text: str, stops) -> bool:
    """Whether a stop string lies in `text` or may begin in its end (the model's own text would have stopped)."""
    return any(stop and stop in text for stop in stops) or partial_marker_length(text, stops) > 0


async def _continue(engine, request: GenerationRequest, plan: RestartPlan, opening: str, ids: list[int], constraint,
                    request_id: str, cached: int) -> AsyncIterator[GenerationOutput]:
    prompt = len(request.prompt_ids)
    sampling = replace(request.sampling, max_tokens=request.sampling.max_tokens - len(ids))
    yield GenerationOutput(request_id, list(ids), opening, num_prompt_tokens=prompt, num_generated_tokens=len(ids),
                           num_cached_tokens=cached)
    # its own id: an abort of the first generation, still queued by id, must not reach it
    second = engine.generate(GenerationRequest([*request.prompt_ids, *ids], sampling, constraint, ""))
    start, end = plan.call_markers
    guard = _RepeatGuard(start, end, opening) if start and end else None
    held: list[GenerationOutput] = []
    released = len(opening)
    try:
        async for out in second:
            out.num_prompt_tokens = prompt
            out.num_cached_tokens = cached
            if out.num_generated_tokens:
                out.num_generated_tokens += len(ids)
            if guard is None:
                yield out
                continue
            repeat = guard.add(out.text)
            held.append(out)
            if repeat is not None:
                kept, dropped, at = [], 0, released
                for h in held:  # the tokens of deltas that begin after the repeat's start are not sent
                    if at < repeat:
                        kept.extend(h.token_ids)
                    else:
                        dropped += len(h.token_ids)
                    at += len(h.text)
                yield GenerationOutput(out.request_id, kept, guard.text[released:repeat], True, "stop",
                                       num_prompt_tokens=prompt, num_generated_tokens=max(0, out.num_generated_tokens - dropped),
                                       num_cached_tokens=cached)
                return
            hold = len(guard.text) if out.finished else guard.hold_from()
            while held and released + len(held[0].text) <= hold:
                kept = held.pop(0)
                released += len(kept.text)
                yield kept
    finally:
        await second.aclose()


class _RepeatGuard:
    """The calls of a restarted reply, written between `start` and `end` markers: each call after the first
    complete one is held back until it is complete, and a complete call equal to an earlier one (same name,
    same arguments as JSON values) is where the reply ends."""

    def __init__(self, start: str, end: str, text: str) -> None:
        self.start, self.end, self.text = start, end, text
        self.checked = 0  # after the last complete call looked at
        self.calls: set[str] = set()

    def add(self, piece: str) -> int | None:
        """Append `piece`; where a call that repeats an earlier one begins, else None."""
        self.text += piece
        while (s := self.text.find(self.start, self.checked)) >= 0 and (e := self.text.find(self.end, s)) >= 0:
            key = _call_key(self.text[s + len(self.start):e])
            if key is not None and key in self.calls:
                return s
            if key is not None:
                self.calls.add(key)
            self.checked = e + len(self.end)
        return None

    def hold_from(self) -> int:
        """Where the text held back begins (its length when nothing is): a call opened after a complete one, or
        what may be the start of one at the end."""
        if not self.calls:
            return len(self.text)
        opened = self.text.find(self.start, self.checked)
        if opened >= 0:
            return opened
        return len(self.text) - partial_marker_length(self.text, (self.start,))


def _call_key(body: str) -> str | None:
    try:
        call = json.loads(body)
    except ValueError:
        return None
    return json.dumps(call, sort_keys=True) if isinstance(call, dict) else None
