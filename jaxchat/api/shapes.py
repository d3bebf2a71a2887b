"""OpenAI response shapes: chat.completion, chat.completion.chunk, text_completion, usage, errors.

Contract: pure builders from parsed messages and counts to the JSON-able dicts the OpenAI API returns;
no I/O, no engine state. Every error body is `{"error": {"message", "type", "param", "code"}}`. `content` is null when a reply is only tool calls; reasoning goes out both as
`reasoning_content` and as `reasoning` (which newer clients read).
"""

from __future__ import annotations

import time
import uuid

from jaxchat.api.custom_input import custom_input
from jaxchat.chat import ChatMsg, ChatMsgDelta


def error_body(
    message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def generation_failed() -> dict:
    """The error item that ends a stream whose generation failed; the details stay in the server log."""
    return error_body("generation failed", "server_error")


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, reasoning_tokens: int = 0, cached_tokens: int = 0) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def tool_call_json(call, custom: frozenset[str] = frozenset()) -> dict:
    """A function call, or (its name in `custom`) a custom tool call whose `input` is its arguments' `input`."""
    if call.name in custom:
        return {"id": call.id, "type": "custom", "custom": {"name": call.name, "input": custom_input(call.arguments)}}
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def custom_tool_names(tools) -> frozenset[str]:
    """The names of the custom tools among normalised `tools`."""
    return frozenset(t["function"]["name"] for t in tools if t.get("custom"))


def message_json(msg: ChatMsg, calls_only: bool = False, custom: frozenset[str] = frozenset()) -> dict:
    """`content` is null when it is empty and the reply is tool calls (or, `calls_only`, must be)."""
    out: dict = {"role": "assistant",
                 "content": msg.content if (msg.content or not (msg.tool_calls or calls_only)) else None}
    if msg.reasoning_content:
        out["reasoning_content"] = msg.reasoning_content
        out["reasoning"] = msg.reasoning_content
    if msg.tool_calls:
        out["tool_calls"] = [tool_call_json(c, custom) for c in msg.tool_calls]
    return out


def chat_completion(rid: str, model: str, choices: list[dict], usage_json: dict) -> dict:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage_json,
    }


def chat_choice(index: int, msg: ChatMsg, finish_reason: str | None, logprobs: dict | None,
                calls_only: bool = False, custom: frozenset[str] = frozenset()) -> dict:
    return {"index": index, "message": message_json(msg, calls_only, custom), "logprobs": logprobs,
            "finish_reason": finish_reason}


def delta_json(delta: ChatMsgDelta) -> dict:
    if delta.tool_call_index is not None:
        call: dict = {"index": delta.tool_call_index}
        function: dict = {"arguments": delta.tool_call_arguments}
        if delta.tool_call_id is not None:
            call["id"] = delta.tool_call_id
            call["type"] = "function"
            function = {"name": delta.tool_call_name, "arguments": delta.tool_call_arguments}
        call["function"] = function
        return {"tool_calls": [call]}
    if delta.reasoning_content:
        return {"reasoning_content": delta.reasoning_content, "reasoning": delta.reasoning_content}
    return {"content": delta.content}


class ChunkFactory:
    """Builds the chunks of one streamed chat completion (shared id, created and model)."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.id = new_id("chatcmpl")
        self.created = int(time.time())
        self.model = model
        self.include_usage = include_usage

    def chunk(self, choices: list[dict]) -> dict:
        out = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model, "choices": choices}
        if self.include_usage:
            out["usage"] = None
        return out

    def delta(self, index: int, delta: dict, finish_reason: str | None = None, logprobs: dict | None = None) -> dict:
        return self.chunk([{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}])

    def usage_chunk(self, usage_json: dict) -> dict:
        out = self.chunk([])
        out["usage"] = usage_json
        return out


def text_completion(rid: str, model: str, choices: list[dict], usage_json: dict | None, chunk: bool = False) -> dict:
    out = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model, "choices": choices}
    if usage_json is not None or not chunk:
        out["usage"] = usage_json
    return out


def logprobs_json(tokenizer, items) -> dict | None:
    """OpenAI chat `logprobs.content` from the engine's `TokenLogprob`s (None when not requested)."""
    if items is None:
        return None
    content = []
    for item in items:
        token = tokenizer.decode([item.token_id])
        content.append(
            {
                "token": token,
                "logprob": item.logprob,
                "bytes": list(token.encode("utf-8")),
                "top_logprobs": [
                    {"token": tokenizer.decode([t]), "logprob": lp, "bytes": list(tokenizer.decode([t]).encode("utf-8"))}
                    for t, lp in item.top
                ],
            }
        )
    return {"content": content}
