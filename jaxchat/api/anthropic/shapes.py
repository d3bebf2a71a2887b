"""Anthropic Messages API shapes: the message, its streamed events and errors, from the chat pipeline's values.

Contract: `message_json(model, reply, prompt_tokens, stop_sequences)` builds the non-streamed
`{"id": "msg_...", "type": "message", "role": "assistant", "model", "content", "stop_reason",
"stop_sequence", "usage": {"input_tokens", "output_tokens"}}` from one parsed `ChatMsg`: content
blocks `thinking` (reasoning), `text` (content) and `tool_use` (`input`: the call's arguments as an
object), in that order. The events of a streamed message: `message_start_event(model,
prompt_tokens)`, then per block (`ContentBlocks.feed(delta)` per `ChatMsgDelta`, `close()`)
`content_block_start`, `content_block_delta` (`thinking_delta`, `text_delta`, `input_json_delta`)
and `content_block_stop`, then `message_end_events(...)`: `message_delta` (stop reason, usage) and
`message_stop`; a failure after the start is one `error` event. Each event's `type` is its SSE
event name. `stop_reason` is
`tool_use` (calls made), `max_tokens` (the output was cut by the token limit, a cut call included),
`stop_sequence` (one of the request's `stop_sequences` ended it; `stop_sequence` names it) or
`end_turn`. `error_json(status, message, param)` is Anthropic's `{"type": "error", "error": {"type",
"message"}}`. Pure builders: no I/O, no engine state.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence

from jaxchat.chat import ChatMsg, ChatMsgDelta

__all__ = ["ContentBlocks", "error_json", "message_end_events", "message_json", "message_start_event",
           "partial_object", "stop_reason"]

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
               529: "overloaded_error"}


def error_json(status: int, message: str, param: str | None = None) -> dict:
    """Anthropic's error body; Anthropic has no `param` field, so the message starts with it."""
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": f"{param}: {message}" if param else message}}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def stop_reason(finish: str | None, engine_stop: str | int | None, stop_sequences: Sequence[str]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) from the chat finish reason and the engine's stop reason."""
    if finish == "tool_calls":
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if isinstance(engine_stop, str) and engine_stop in stop_sequences:
        return "stop_sequence", engine_stop
    return "end_turn", None


def partial_object(arguments: str) -> dict:
    """A call's arguments as an object; the arguments of a call cut short are closed where they stop."""
    try:
        value = json.loads(arguments)
        return value if isinstance(value, dict) else {"value": value}
    except ValueError:
        pass
    text, closers, in_string, escape = arguments.rstrip().rstrip(","), [], False, False
    for ch in text:
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            closers.append("}" if ch == "{" else "]")
        elif ch in "}]" and closers:
            closers.pop()
    if escape:
        text = text[:-1]
    tail = "".join(reversed(closers))
    for fix in (("",) if not in_string else ('"', '":null')) + ("null", '"":null'):
        try:
            value = json.loads(text + fix + tail)
            return value if isinstance(value, dict) else {}
        except ValueError:
            continue
    return {}


def usage_json(input_tokens: int, output_tokens: int) -> dict:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def message_json(model: str, msg: ChatMsg, finish: str | None, engine_stop: str | int | None, prompt_tokens: int,
                 output_tokens: int, stop_sequences: Sequence[str]) -> dict:
    content: list[dict] = []
    if msg.reasoning_content:
        content.append({"type": "thinking", "thinking": msg.reasoning_content, "signature": ""})
    if msg.content:
        content.append({"type": "text", "text": msg.content})
    for call in msg.tool_calls:
        content.append({"type": "tool_use", "id": new_id("toolu"), "name": call.name,
                        "input": partial_object(call.arguments)})
    reason, sequence = stop_reason(finish, engine_stop, stop_sequences)
    return {"id": new_id("msg"), "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage_json(prompt_tokens, output_tokens)}


def message_start_event(model: str, prompt_tokens: int) -> dict:
    message = {"id": new_id("msg"), "type": "message", "role": "assistant", "model": model, "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": usage_json(prompt_tokens, 0)}
    return {"type": "message_start", "message": message}


def message_end_events(finish: str | None, engine_stop: str | int | None, prompt_tokens: int, output_tokens: int,
                       stop_sequences: Sequence[str]) -> list[dict]:
    reason, sequence = stop_reason(finish, engine_stop, stop_sequences)
    return [{"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
             "usage": usage_json(prompt_tokens, output_tokens)},
            {"type": "message_stop"}]


class ContentBlocks:
    """Turns `ChatMsgDelta`s into content block events; one block open at a time."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "thinking", "text" or "tool_use:<call index>"

    def _switch(self, kind: str, block: dict) -> list[dict]:
        events = self.close()
        self.index += 1
        self.open = kind
        return events + [{"type": "content_block_start", "index": self.index, "content_block": block}]

    def _delta(self, delta: dict) -> dict:
        return {"type": "content_block_delta", "index": self.index, "delta": delta}

    def close(self) -> list[dict]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.index}]

    def feed(self, d: ChatMsgDelta) -> list[dict]:
        events: list[dict] = []
        if d.tool_call_index is not None:
            kind = f"tool_use:{d.tool_call_index}"
            if d.tool_call_id is not None or self.open != kind:
                events += self._switch(kind, {"type": "tool_use", "id": new_id("toolu"), "name": d.tool_call_name or "",
                                              "input": {}})
            if d.tool_call_arguments:
                events.append(self._delta({"type": "input_json_delta", "partial_json": d.tool_call_arguments}))
        elif d.reasoning_content:
            if self.open != "thinking":
                events += self._switch("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            events.append(self._delta({"type": "thinking_delta", "thinking": d.reasoning_content}))
        elif d.content:
            if self.open != "text":
                events += self._switch("text", {"type": "text", "text": ""})
            events.append(self._delta({"type": "text_delta", "text": d.content}))
        return events
