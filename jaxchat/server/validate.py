"""Generic validation of `/v1/chat/completions` and `/v1/completions` bodies, shared by server and service.

Contract
--------
`validate_chat_body(body, limits, max_context=None)` and `validate_completion_body(...)` are pure:
they return a fresh, normalised copy of the body or raise `jaxchat.chat.RequestError(param, message)`
whose `param` names the offending field the way the OpenAI API spells it (`messages[2].role`,
`stream_options.include_usage`, `stop[1]`). Normalisation (idempotent):

* a field set to null is removed (null means absent); unknown fields are kept untouched;
* `stop` becomes a list of strings; `max_tokens` and `max_completion_tokens` both hold the effective
  limit (`max_completion_tokens` wins) when either is given.

What is checked: `model` (a string when present), `messages` (a non-empty list of at most
`limits.max_messages` objects whose `role` is system/developer/user/assistant/tool and whose
`content` is a string or a list of text parts, or null/absent for an assistant turn that has
`tool_calls`; assistant `tool_calls` shapes; `name`, `tool_call_id`, `reasoning_content` types),
`stream` and `stream_options.include_usage` (booleans; `stream_options` needs `stream: true`),
`n` 1..`limits.max_n`, `max_tokens` / `max_completion_tokens` positive and within the context,
`temperature` 0..2, `top_p` (0, 1], `top_k` an integer >= -1, `min_p` 0..1, `presence_penalty` and
`frequency_penalty` -2..2, `repetition_penalty` > 0, `seed` a 64-bit integer, `logprobs` a boolean,
`top_logprobs` 0..20 with `logprobs: true`, `stop` a string or at most `limits.max_stop` non-empty
strings, `ignore_eos` a boolean, `stop_token_ids` non-negative integers, and at most
`limits.max_tools` tools. For chat bodies the tool, `tool_choice`, `response_format` and thinking
fields are then checked by `jaxchat.chat.chat_constraint_request_from_openai`. For completion bodies
`prompt` is a string or a list of token ids (or a one-item list of either), `echo` a boolean and
`logprobs` an integer 0..5. Booleans never pass as numbers, and numbers must be finite.
"""

from __future__ import annotations

import math

from jaxchat.chat import RequestError, chat_constraint_request_from_openai
from jaxchat.chat.request_tools import got
from jaxchat.server.limits import ServerLimits

__all__ = ["ROLES", "validate_chat_body", "validate_completion_body"]

ROLES = ("system", "developer", "user", "assistant", "tool")
_SEED_RANGE = (-(2**63), 2**64 - 1)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _int(body: dict, key: str, lo: int, hi: int | None, what: str = "") -> None:
    value = body.get(key)
    if value is None:
        return
    if not _is_int(value):
        raise RequestError(key, f"expected an integer, got {got(value)}")
    if value < lo or (hi is not None and value > hi):
        bound = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise RequestError(key, f"{key} must be {bound}{what}, got {value}")


def _number(body: dict, key: str, lo: float, hi: float | None, lo_open: bool = False) -> None:
    value = body.get(key)
    if value is None:
        return
    if not _is_number(value):
        raise RequestError(key, f"expected a finite number, got {got(value)}")
    too_low = value <= lo if lo_open else value < lo
    if too_low or (hi is not None and value > hi):
        low = f"greater than {lo}" if lo_open else f"at least {lo}"
        bound = low if hi is None else f"{low} and at most {hi}"
        raise RequestError(key, f"{key} must be {bound}, got {value}")


def _bool(body: dict, key: str) -> None:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise RequestError(key, f"expected a boolean (true or false), got {got(value)}")


def _drop_nulls(body: object) -> dict:
    if not isinstance(body, dict):
        raise RequestError(None, f"the request body must be a JSON object, got {got(body)}")
    return {k: v for k, v in body.items() if v is not None}


def _check_sampling(body: dict, limits: ServerLimits, max_context: int | None) -> None:
    """Fields shared by both endpoints; normalises `max_tokens`, `stop` and `stream_options` in place."""
    if "model" in body and not isinstance(body["model"], str):
        raise RequestError("model", f"expected the model name as a string, got {got(body['model'])}")
    _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict):
            raise RequestError(
                "stream_options", f"expected an object like {{'include_usage': true}}, got {got(options)}"
            )
        if not body.get("stream"):
            raise RequestError("stream_options", "stream_options is only allowed when stream is true")
        for key in ("include_usage", "continuous_usage_stats"):
            value = options.get(key)
            if value is not None and not isinstance(value, bool):
                raise RequestError(f"stream_options.{key}", f"expected a boolean (true or false), got {got(value)}")
    _int(body, "n", 1, limits.max_n)
    cap = max_context if max_context else limits.max_tokens_cap
    for key in ("max_tokens", "max_completion_tokens"):
        _int(body, key, 1, cap, f" (the model's context is {max_context} tokens)" if max_context else "")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        body["max_tokens"] = body["max_completion_tokens"] = limit
    _number(body, "temperature", 0.0, 2.0)
    _number(body, "top_p", 0.0, 1.0, lo_open=True)
    _int(body, "top_k", -1, None)
    _number(body, "min_p", 0.0, 1.0)
    _number(body, "presence_penalty", -2.0, 2.0)
    _number(body, "frequency_penalty", -2.0, 2.0)
    _number(body, "repetition_penalty", 0.0, None, lo_open=True)
    _int(body, "seed", *_SEED_RANGE)
    _bool(body, "ignore_eos")
    _check_stop(body, limits)
    ids = body.get("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list):
            raise RequestError("stop_token_ids", f"expected an array of token ids, got {got(ids)}")
        for i, tok in enumerate(ids):
            if not _is_int(tok) or tok < 0:
                raise RequestError(f"stop_token_ids[{i}]", f"expected a non-negative integer, got {got(tok)}")


def _check_stop(body: dict, limits: ServerLimits) -> None:
    stop = body.get("stop")
    if stop is None:
        return
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list):
        raise RequestError("stop", f"expected a string or an array of strings, got {got(stop)}")
    if len(items) > limits.max_stop:
        raise RequestError("stop", f"at most {limits.max_stop} stop sequences are allowed, got {len(items)}")
    for i, item in enumerate(items):
        param = "stop" if isinstance(stop, str) else f"stop[{i}]"
        if not isinstance(item, str):
            raise RequestError(param, f"expected a string, got {got(item)}")
        if not item:
            raise RequestError(param, "stop sequences must not be empty")
    body["stop"] = list(items)


def _check_content(content: object, param: str) -> None:
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


def _check_tool_calls(calls: object, param: str) -> None:
    if not isinstance(calls, list):
        raise RequestError(param, f"expected an array of tool calls, got {got(calls)}")
    for j, call in enumerate(calls):
        where = f"{param}[{j}]"
        if not isinstance(call, dict):
            raise RequestError(where, f"expected a tool call object, got {got(call)}")
        if call.get("id") is not None and not isinstance(call["id"], str):
            raise RequestError(f"{where}.id", f"expected a string, got {got(call['id'])}")
        if call.get("type") not in (None, "function"):
            raise RequestError(f"{where}.type", f"only 'function' tool calls are supported, got {got(call['type'])}")
        fn = call.get("function")
        if not isinstance(fn, dict):
            raise RequestError(f"{where}.function", f"expected an object with 'name' and 'arguments', got {got(fn)}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise RequestError(f"{where}.function.name", f"expected a non-empty string, got {got(fn.get('name'))}")
        args = fn.get("arguments")
        if args is not None and not isinstance(args, (str, dict)):
            raise RequestError(f"{where}.function.arguments", f"expected a JSON string, got {got(args)}")


def _check_message(msg: object, i: int) -> None:
    param = f"messages[{i}]"
    if not isinstance(msg, dict):
        raise RequestError(param, f"expected a message object, got {got(msg)}")
    role = msg.get("role")
    if role not in ROLES:
        raise RequestError(f"{param}.role", f"expected one of {', '.join(ROLES)}, got {got(role)}")
    content = msg.get("content")
    calls = msg.get("tool_calls")
    if role == "assistant":
        if calls is not None:
            _check_tool_calls(calls, f"{param}.tool_calls")
        if content is None and not calls and not msg.get("reasoning_content") and not msg.get("reasoning"):
            raise RequestError(f"{param}.content", "an assistant message needs content or tool_calls")
        for key in ("reasoning_content", "reasoning"):
            if msg.get(key) is not None and not isinstance(msg[key], str):
                raise RequestError(f"{param}.{key}", f"expected a string, got {got(msg[key])}")
    else:
        if calls is not None:
            raise RequestError(f"{param}.tool_calls", f"only assistant messages may carry tool_calls, not {role}")
        if content is None:
            raise RequestError(f"{param}.content", f"missing required field: the content of a {role} message")
    if content is not None:
        _check_content(content, f"{param}.content")
    for key in ("name", "tool_call_id"):
        if msg.get(key) is not None and not isinstance(msg[key], str):
            raise RequestError(f"{param}.{key}", f"expected a string, got {got(msg[key])}")


def validate_chat_body(body: object, limits: ServerLimits | None = None, max_context: int | None = None) -> dict:
    limits = limits or ServerLimits()
    out = _drop_nulls(body)
    messages = out.get("messages")
    if messages is None:
        raise RequestError("messages", "missing required field: messages (a non-empty array of message objects)")
    if not isinstance(messages, list):
        raise RequestError("messages", f"expected an array of message objects, got {got(messages)}")
    if not messages:
        raise RequestError("messages", "messages must not be empty")
    if len(messages) > limits.max_messages:
        raise RequestError("messages", f"at most {limits.max_messages} messages are allowed, got {len(messages)}")
    for i, msg in enumerate(messages):
        _check_message(msg, i)
    tools = out.get("tools")
    if isinstance(tools, list) and len(tools) > limits.max_tools:
        raise RequestError("tools", f"at most {limits.max_tools} tools are allowed, got {len(tools)}")
    _check_sampling(out, limits, max_context)
    _bool(out, "logprobs")
    _int(out, "top_logprobs", 0, limits.max_top_logprobs)
    if out.get("top_logprobs") is not None and not out.get("logprobs"):
        raise RequestError("top_logprobs", "top_logprobs needs logprobs set to true")
    chat_constraint_request_from_openai(out)
    return out


def validate_completion_body(body: object, limits: ServerLimits | None = None, max_context: int | None = None) -> dict:
    limits = limits or ServerLimits()
    out = _drop_nulls(body)
    prompt = out.get("prompt")
    if prompt is None:
        raise RequestError("prompt", "missing required field: prompt (a string or an array of token ids)")
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) > limits.max_prompt_items:
            raise RequestError("prompt", f"at most {limits.max_prompt_items} prompt(s) per request, got {len(prompt)}")
        prompt = out["prompt"] = prompt[0]
    if isinstance(prompt, list):
        if not prompt:
            raise RequestError("prompt", "prompt must not be empty")
        for i, tok in enumerate(prompt):
            if not _is_int(tok) or tok < 0:
                raise RequestError(f"prompt[{i}]", f"expected a non-negative token id, got {got(tok)}")
    elif not isinstance(prompt, str):
        raise RequestError("prompt", f"expected a string or an array of token ids, got {got(prompt)}")
    if out.get("suffix"):
        raise RequestError("suffix", "suffix is not supported")
    _check_sampling(out, limits, max_context)
    _bool(out, "echo")
    _int(out, "logprobs", 0, 5)
    return out
