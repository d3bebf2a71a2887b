"""What the chat pipeline produces before any wire shape: the parsed replies and the streamed steps.

Contract: `ChatService.chat_replies(request)` returns `ChatReplies` (the prepared request and one
`ChatReply` per choice: the message `chat_parse` read once, its finish reason as chat completions
report it, the engine's stop reason and token counts). `ChatService.chat_run(request)` raises every
400 that needs the model, then returns a `ChatRun`: an async iterator of `ChoiceStep`s (one per
engine output: the `ChatMsgDelta`s the prefix-stable `ChatStream` produced, the raw logprobs, and on
a choice's last step its finish reason), which raises `GenerationFailed` after the deltas that
preceded a failure. Chat completion chunks and the Anthropic Messages events are both written from
these values, so every API reads the same deltas; closing a run aborts its engine requests.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass

from jaxchat.chat import ChatMsg, ChatMsgDelta

__all__ = ["ChatReplies", "ChatReply", "ChatRun", "ChoiceStep", "GenerationFailed"]


class GenerationFailed(RuntimeError):
    """A generation failed after the response started (details in the server log, never sent)."""


@dataclass(frozen=True)
class ChatReply:
    msg: ChatMsg
    finish_reason: str | None  # as chat completions report it (`jaxchat.api.cut.cut_finish_reason`)
    stop_reason: str | int | None  # the stop string or token id that ended the output
    cut: bool  # read as cut before the end of the turn
    num_tokens: int
    reasoning_tokens: int
    logprobs: list | None


@dataclass(frozen=True)
class ChatReplies:
    prompt_tokens: int
    calls_only: bool  # tool_choice "required" or named: `content` is null
    replies: list[ChatReply]


@dataclass(frozen=True)
class ChoiceStep:
    index: int
    deltas: list[ChatMsgDelta]
    logprobs: list | None = None
    finish_reason: str | None = None  # set on the choice's last step only
    stop_reason: str | int | None = None
    num_tokens: int = 0  # on the last step: the choice's generated tokens
    reasoning_tokens: int = 0  # on the last step


class ChatRun:
    """The steps of one streamed chat request; `prompt_tokens`, `n` and `calls_only` are known up front."""

    def __init__(self, prompt_tokens: int, n: int, calls_only: bool,
                 steps: AsyncGenerator[ChoiceStep, None]) -> None:
        self.prompt_tokens = prompt_tokens
        self.n = n
        self.calls_only = calls_only
        self._steps = steps

    def __aiter__(self) -> ChatRun:
        return self

    async def __anext__(self) -> ChoiceStep:
        return await self._steps.__anext__()

    async def aclose(self) -> None:
        await self._steps.aclose()
