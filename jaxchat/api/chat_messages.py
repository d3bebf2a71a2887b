"""The `messages` of a chat request: roles, content parts and the assistant's earlier tool calls.

Contract: `parse_messages(raw, limits)` returns the messages as a tuple of dicts (shallow copies,
handed to the chat template as they came; a null field reads as absent) or raises `RequestError` naming the offending field (`messages[2].role`,
`messages[1].tool_calls[0].function.name`). A message's `role` is system, developer, user,
assistant or tool; its `content` is a string or a list of text parts, and may be null or absent
only on an assistant turn that has `tool_calls` or reasoning; only assistant turns carry
`tool_calls`; `name`, `tool_call_id`, `reasoning_content` and `reasoning` are strings. An earlier custom tool
call (`{"type": "custom", "custom": {"name", "input"}}`) reaches the template as the function call the model
wrote for it (`arguments` `{"input": ...}`).
"""

from __future__ import annotations

import json

from jaxchat.api.limits import Limits
from jaxchat.chat.errors import RequestError, expect_items, expect_str, got

__all__ = ["ROLES", "parse_messages"]

ROLES = ("system", "developer", "user", "assistant", "tool")


def parse_messages(raw: object, limits: Limits) -> tuple[dict, ...]:
    raw = expect_items(raw, "messages", "message objects")
    if len(raw) > limits.max_messages:
        raise RequestError("messages", f"at most {limits.max_messages} messages are allowed, got {len(raw)}")
    return tuple(_message(msg, i) for i, msg in enumerate(raw))


def _message(msg: object, i: int) -> dict:
    param = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise RequestError(param, f"expected a message object, got {got(msg)}")
    msg = dict(msg)
    role = msg.get("role")
    if role not in ROLES:
        raise RequestError(f"{param}.role", f"expected one of {', '.join(ROLES)}, got {got(role)}")
    content = msg.get("content")
    calls = msg.get("tool_calls")
    if role == "assistant":
        if calls is not None:
            _tool_calls(calls, f"{param}.tool_calls")
            msg["tool_calls"] = [_as_function_call(call) for call in calls]
        for key in ("reasoning_content", "reasoning"):
            expect_str(msg.get(key), f"{param}.{key}")
        if content is None and not calls and not msg.get("reasoning_content") and not msg.get("reasoning"):
            raise RequestError(f"{param}.content", "an assistant message needs content or tool_calls")
    else:
        if calls is not None:
            raise RequestError(f"{param}.tool_calls", f"only assistant messages may carry tool_calls, not {role}")
        if content is None:
            raise RequestError(f"{param}.content", f"missing required field: the content of a {role} message")
    if content is not None:
        _content(content, f"{param}.content")
    for key in ("name", "tool_call_id"):
        expect_str(msg.get(key), f"{param}.{key}")
    return msg


def _content(content: object, param: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise RequestError(param, f"expected a string or an array of text parts, got {got(content)}")
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise RequestError(
                where, f"expected a content part object like {{'type': 'text', 'text': '...'}}, got {got(part)}"
            )
        if part.get("type") != "text":
            raise RequestError(f"{where}.type", f"only 'text' content parts are supported, got {got(part.get('type'))}")
        if not isinstance(part.get("text"), str):
            raise RequestError(f"{where}.text", f"expected a string, got {got(part.get('text'))}")


def _as_function_call(call: dict) -> dict:
    """A custom tool call as the function call the prompt shows (its input as the one argument `input`)."""
    if call.get("type") != "custom":
        return call
    custom = call["custom"]
    out = {"type": "function", "function": {"name": custom["name"],
                                            "arguments": json.dumps({"input": custom["input"]}, ensure_ascii=False)}}
    return {**({"id": call["id"]} if call.get("id") is not None else {}), **out}


def _tool_calls(calls: object, param: str) -> None:
    if not isinstance(calls, list):
        raise RequestError(param, f"expected an array of tool calls, got {got(calls)}")
    for j, call in enumerate(calls):
        where = f"{param}[{j}]"
        if not isinstance(call, dict):
            raise RequestError(where, f"expected a tool call object, got {got(call)}")
        expect_str(call.get("id"), f"{where}.id")
        if call.get("type") == "custom":
            custom = call.get("custom")
            if not isinstance(custom, dict) or not isinstance(custom.get("name"), str) or not custom["name"]:
                raise RequestError(f"{where}.custom", f"expected an object with 'name' and 'input', got {got(custom)}")
            if not isinstance(custom.get("input"), str):
                raise RequestError(f"{where}.custom.input", f"expected a string, got {got(custom.get('input'))}")
            continue
        if call.get("type") not in (None, "function"):
            raise RequestError(f"{where}.type", f"expected a 'function' or 'custom' tool call, got {got(call['type'])}")
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise RequestError(f"{where}.function", f"expected an object with 'name' and 'arguments', got {got(fn)}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(f"{where}.function.name", f"expected a non-empty string, got {got(fn.get('name'))}")
        args = fn.get("arguments")
        if args is not None and not isinstance(args, (str, dict)):
            raise RequestError(f"{where}.function.arguments", f"expected a JSON string, got {got(args)}")
