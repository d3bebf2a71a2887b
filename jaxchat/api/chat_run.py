"""One chat request running through engine and parser: the per-choice updates every stream is written from.

Contract: `ChatRun(pipeline, request)` prepares the request on the `ChatPipeline` (`prepare_chat`: every
400 that needs the model), builds one constraint per choice and starts the engine requests, so whatever can
be a 400 is raised by the constructor, before any output; construct it inside the event loop, with
`await ChatRun.start(pipeline, request)`, which first compiles the request's grammars off the event loop
(`ChatPipeline.compile_grammars`) so the constructor finds them cached.
`updates()` yields one `ChoiceUpdate` per engine delta of any choice (choices interleave as the engine
produces them): the parser's `ChatMsgDelta`s (prefixes by construction, `ChatStream`), the engine's
logprobs for those tokens, and on a choice's last update `finished`, its finish reason (an output cut
before the end of its turn is read as the stream read it and keeps the engine's reason:
`jaxchat.api.cut`), the engine's stop reason, the parsed message and its token counts. A failed
generation is one update with `failed` set (after that choice's last deltas); nothing follows it.
Ending or closing `updates()` cancels the engine requests, which aborts them. Chat chunks
(`jaxchat.api.openai.chat_completions`), Responses events (`jaxchat.api.responses.adapter`) and Messages
events (`jaxchat.api.anthropic.adapter`) are all written from these updates.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from jaxchat.api.cut import cut_finish_reason
from jaxchat.api.pipeline import ChatPipeline, calls_only
from jaxchat.api.request import ChatRequest
from jaxchat.chat import ChatMsg, ChatMsgDelta, ChatStream

__all__ = ["ChatRun", "ChoiceUpdate"]

log = logging.getLogger("jaxchat")


@dataclass(frozen=True)
class ChoiceUpdate:
    index: int
    deltas: tuple[ChatMsgDelta, ...] = ()
    logprobs: list | None = None  # the engine's TokenLogprobs of this update's tokens (None when not asked)
    finished: bool = False
    finish_reason: str | None = None  # the OpenAI chat finish reason, on the last update
    message: ChatMsg | None = None  # the whole parsed message, on the last update
    num_tokens: int = 0  # generated tokens, on the last update
    reasoning_tokens: int = 0  # tokens of the message's reasoning, on the last update
    failed: bool = False
    stop_reason: str | int | None = None  # the stop string or token id that ended it, on the last update
    cached_tokens: int = 0  # prompt tokens reused from the engine's prefix cache, on the last update


class ChatRun:
    def __init__(self, pipeline: ChatPipeline, request: ChatRequest) -> None:
        self.pipeline = pipeline
        self.request = request
        self.prepared = prepared = pipeline.prepare_chat(request)
        gens = pipeline.chat_requests(prepared)
        self._queue: asyncio.Queue = asyncio.Queue()
        self._tasks = [asyncio.ensure_future(pipeline.pump(i, g, self._queue, prepared)) for i, g in enumerate(gens)]
        self.parsers = [ChatStream(pipeline.spec, prepared.options) for _ in gens]
        for parser in self.parsers:
            parser.update(prepared.prefill, False)

    @classmethod
    async def start(cls, pipeline: ChatPipeline, request: ChatRequest) -> ChatRun:
        await pipeline.compile_grammars(request.constraint)
        return cls(pipeline, request)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prepared.prompt_ids)

    @property
    def calls_only(self) -> bool:
        """tool_choice "required" or named: the reply is tool calls, so a chat `content` is null."""
        return calls_only(self.prepared)

    async def updates(self) -> AsyncIterator[ChoiceUpdate]:
        pipeline, done = self.pipeline, 0
        try:
            while done < len(self._tasks):
                index, out = await self._queue.get()
                if isinstance(out, BaseException):
                    yield ChoiceUpdate(index, failed=True)
                    return
                parser = self.parsers[index]
                cut = out.finished and pipeline.was_cut(self.request, self.prepared, out.finish_reason, out.stop_reason)
                deltas = tuple(parser.update(out.text, out.finished and out.finish_reason != "error" and not cut))
                if out.finished and out.finish_reason == "error":
                    log.error("request failed: %s", out.error)
                    yield ChoiceUpdate(index, deltas, out.logprobs, failed=True)
                    return
                if not out.finished:
                    yield ChoiceUpdate(index, deltas, out.logprobs)
                    continue
                done += 1
                msg = parser.parsed
                yield ChoiceUpdate(index, deltas, out.logprobs, True, cut_finish_reason(msg, out.finish_reason, cut),
                                   msg, out.num_generated_tokens, pipeline.count_tokens(msg.reasoning_content),
                                   stop_reason=out.stop_reason, cached_tokens=out.num_cached_tokens)
        finally:
            self.cancel()

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()
