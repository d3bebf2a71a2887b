"""Streaming: turn ever longer texts of one assistant turn into OpenAI-style deltas.

Contract: `ChatStream(spec, options).update(text, is_final)` appends `text` to the turn, parses it
(resuming the parser, so a whole stream costs linear time) and returns the `ChatMsgDelta`s since the
last update: the new reasoning suffix, the new content suffix, and per tool call either a first delta
(a stable `call_` + 24-character id, the name, the arguments so far) or an arguments suffix.
`chat_compute_deltas(prev, cur)` is the pure function behind it: a field that fails to extend its
previous value is logged (`chat parser rewrote already streamed ...`) and skipped, never sent.
`chat_finish_reason` promotes "stop" to "tool_calls" only on a clean end-of-turn stop with calls.
"""

from __future__ import annotations

import logging
import secrets
import string
from collections.abc import Callable
from dataclasses import replace

from jaxchat.chat.msg import ChatMsg, ChatMsgDelta, ChatParseOptions, ToolCall
from jaxchat.chat.parse import make_parser
from jaxchat.chat.spec import ChatFormatSpec

log = logging.getLogger("jaxchat")

_ID_ALPHABET = string.ascii_letters + string.digits


def new_tool_call_id() -> str:
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


def _suffix(field: str, prev: str, cur: str) -> str:
    if cur.startswith(prev):
        return cur[len(prev):]
    log.warning("chat parser rewrote already streamed %s: %r -> %r", field, prev[-40:], cur[-40:])
    return ""


def chat_compute_deltas(prev: ChatMsg, cur: ChatMsg, first_call: int = 0) -> list[ChatMsgDelta]:
    """Deltas from `prev` to `cur`; calls before `first_call` are known to be equal in both."""
    deltas: list[ChatMsgDelta] = []
    reasoning = _suffix("reasoning_content", prev.reasoning_content, cur.reasoning_content)
    if reasoning:
        deltas.append(ChatMsgDelta(reasoning_content=reasoning))
    content = _suffix("content", prev.content, cur.content)
    if content:
        deltas.append(ChatMsgDelta(content=content))
    for index in range(first_call, len(cur.tool_calls)):
        call = cur.tool_calls[index]
        if index >= len(prev.tool_calls):
            deltas.append(
                ChatMsgDelta(
                    tool_call_index=index,
                    tool_call_id=call.id,
                    tool_call_name=call.name,
                    tool_call_arguments=call.arguments,
                )
            )
            continue
        before = prev.tool_calls[index]
        if before.name != call.name:
            log.warning("chat parser rewrote already streamed tool call %d name: %r -> %r", index, before.name, call.name)
            continue
        arguments = _suffix(f"tool call {index} arguments", before.arguments, call.arguments)
        if arguments:
            deltas.append(ChatMsgDelta(tool_call_index=index, tool_call_arguments=arguments))
    if len(cur.tool_calls) < len(prev.tool_calls):
        log.warning("chat parser rewrote already streamed tool calls: %d -> %d", len(prev.tool_calls), len(cur.tool_calls))
    return deltas


def apply_deltas(msg: ChatMsg, deltas: list[ChatMsgDelta]) -> ChatMsg:
    """The message a client holds after receiving `deltas` on top of `msg` (which is left as it was)."""
    out = ChatMsg(msg.reasoning_content, msg.content, [replace(c) for c in msg.tool_calls])
    apply_deltas_in_place(out, deltas)
    return out


def apply_deltas_in_place(out: ChatMsg, deltas: list[ChatMsgDelta]) -> None:
    for delta in deltas:
        out.reasoning_content += delta.reasoning_content
        out.content += delta.content
        if delta.tool_call_index is None:
            continue
        if delta.tool_call_index == len(out.tool_calls):
            out.tool_calls.append(ToolCall(delta.tool_call_name or "", "", delta.tool_call_id or ""))
        out.tool_calls[delta.tool_call_index].arguments += delta.tool_call_arguments


def chat_finish_reason(msg: ChatMsg, engine_reason: str | None) -> str | None:
    """OpenAI finish_reason: `tool_calls` only when the turn ended cleanly (a stop) with calls."""
    if engine_reason == "stop" and msg.tool_calls:
        return "tool_calls"
    return engine_reason


class ChatStream:
    def __init__(
        self,
        spec: ChatFormatSpec,
        options: ChatParseOptions = ChatParseOptions(),
        new_id: Callable[[], str] = new_tool_call_id,
    ) -> None:
        self._parser = make_parser(spec, options)
        self._new_id = new_id
        self._text = ""
        self._ids: list[str] = []
        self.sent = ChatMsg()  # what the client holds: the sum of all deltas returned so far
        self.parsed = ChatMsg()  # the latest parse
        self._settled = 0  # leading calls that are closed in the parser and fully sent

    @property
    def text(self) -> str:
        return self._text

    def update(self, text: str, is_final: bool) -> list[ChatMsgDelta]:
        self._text += text
        cur = self._parser.parse(self._text, not is_final)
        while len(self._ids) < len(cur.tool_calls):
            self._ids.append(self._new_id())
        for index in range(self._settled, len(cur.tool_calls)):
            cur.tool_calls[index].id = self._ids[index]
        self.parsed = cur
        deltas = chat_compute_deltas(self.sent, cur, self._settled)
        apply_deltas_in_place(self.sent, deltas)
        closed = self._parser.closed_calls
        while self._settled < min(closed, len(self.sent.tool_calls)) and (
            self.sent.tool_calls[self._settled].arguments == cur.tool_calls[self._settled].arguments
        ):
            self._settled += 1
        return deltas
