"""Read an Anthropic Messages API body (`POST /v1/messages`) once, into the chat pipeline's `ChatRequest`.

Contract
--------
`parse_messages_request(body, limits=None, max_context=None) -> ChatRequest` is pure and raises
`jaxchat.chat.RequestError` whose `param` names the field as the Anthropic API spells it
(`messages[1].content[0].tool_use_id`, `tools[0].input_schema`, `tool_choice.name`,
`stop_sequences[1]`, `thinking.budget_tokens`). It converts the body into an OpenAI chat body and
reads that with `jaxchat.api.parse_chat_request` (so `chat_constraint_request_from_openai` runs
exactly once, the bounds of `Limits` apply and every schema is checked), translating the params of
its errors back; grammar, engine and parser are the chat completions' own.

The conversion: `system` (a string or text blocks) becomes the first message; a user turn's
`tool_result` blocks become `tool` messages (in order, before the turn's text); an assistant turn's
`text`, `tool_use` (its `input` object as the call's arguments) and `thinking` blocks become one
assistant message with `tool_calls` and `reasoning_content` (`redacted_thinking` is dropped);
`tools` (`name`, `description`, `input_schema`; type absent or `custom`) become function tools;
`tool_choice` `auto` / `any` / `tool` (`name`) / `none` becomes "auto" / "required" / the named
function / "none", and `disable_parallel_tool_use` turns off `parallel_tool_calls`; `thinking`
`enabled` turns reasoning on (`budget_tokens` an integer >= 1, not enforced as a budget), `disabled`
or absent turns it off (Anthropic's default); `stop_sequences` become `stop`. `max_tokens` is
required, as Anthropic requires it. `temperature` is 0..1, `top_p` (0, 1], `top_k` >= 0; `stream`
a boolean; `metadata` and other unknown fields are ignored. Image and document blocks are a 400.
"""

from __future__ import annotations

import re

from jaxchat.api.limits import Limits
from jaxchat.api.request import ChatRequest, parse_chat_request
from jaxchat.chat.errors import RequestError, expect_bool, expect_int, expect_items, expect_number, got

__all__ = ["parse_messages_request"]

ROLES = ("user", "assistant")
USER_BLOCKS = ("text", "tool_result")
ASSISTANT_BLOCKS = ("text", "tool_use", "thinking", "redacted_thinking")

# OpenAI params of the converted body → the Anthropic field they came from
_PARAMS = [
    (re.compile(r"^tools\[(\d+)\]\.function\.parameters.*"), r"tools[\1].input_schema"),
    (re.compile(r"^tools\[(\d+)\]\.function\.(name|description)$"), r"tools[\1].\2"),
    (re.compile(r"^tools\[(\d+)\]\.function.*"), r"tools[\1]"),
    (re.compile(r"^tool_choice\.function\.name$"), "tool_choice.name"),
    (re.compile(r"^tool_choice\..*"), "tool_choice"),
    (re.compile(r"^parallel_tool_calls$"), "tool_choice.disable_parallel_tool_use"),
    (re.compile(r"^stop(\[\d+\])?$"), r"stop_sequences\1"),
    (re.compile(r"^messages\[.*"), "messages"),  # the converted list: only its length can be refused
    (re.compile(r"^chat_template_kwargs.*"), "thinking"),
]


def _anthropic_param(param: str | None) -> str | None:
    for pattern, repl in _PARAMS:
        if param is not None and pattern.match(param):
            return pattern.sub(repl, param)
    return param


def _text_blocks(raw: object, param: str) -> list[dict]:
    """A string or an array of text blocks, as OpenAI text parts."""
    if isinstance(raw, str):
        return [{"type": "text", "text": raw}]
    if not isinstance(raw, list):
        raise RequestError(param, f"expected a string or an array of text blocks, got {got(raw)}")
    for j, block in enumerate(raw):
        _block_type(block, f"{param}[{j}]", ("text",))
        _string(block, "text", f"{param}[{j}]")
    return [{"type": "text", "text": b["text"]} for b in raw]


def _block_type(block: object, param: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(block, dict):
        raise RequestError(param, f"expected a content block object like {{'type': 'text', 'text': '...'}}, "
                           f"got {got(block)}")
    kind = block.get("type")
    if kind not in allowed:
        raise RequestError(f"{param}.type", f"expected one of {', '.join(allowed)}, got {got(kind)}")
    return kind


def _string(block: dict, key: str, param: str, required: bool = True) -> str | None:
    value = block.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise RequestError(f"{param}.{key}", f"expected a string, got {got(value)}")
    return value


def _user(content: list, param: str) -> list[dict]:
    tools, parts = [], []
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        if _block_type(block, where, USER_BLOCKS) == "text":
            parts.append({"type": "text", "text": _string(block, "text", where)})
            continue
        call_id = _string(block, "tool_use_id", where)
        result = block.get("content")
        texts = [] if result is None else _text_blocks(result, f"{where}.content")
        text = "".join(t["text"] for t in texts)
        if expect_bool(block.get("is_error"), f"{where}.is_error", False):
            text = f"Error: {text}"
        tools.append({"role": "tool", "tool_call_id": call_id, "content": text})
    return tools + ([{"role": "user", "content": parts}] if parts else [])


def _assistant(content: list, param: str) -> dict:
    texts, calls, thinking = [], [], []
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        kind = _block_type(block, where, ASSISTANT_BLOCKS)
        if kind == "text":
            texts.append(_string(block, "text", where))
        elif kind == "thinking":
            thinking.append(_string(block, "thinking", where))
        elif kind == "tool_use":
            call_id, name = _string(block, "id", where), _string(block, "name", where)
            if not isinstance(block.get("input"), dict):
                raise RequestError(f"{where}.input", f"expected an object, got {got(block.get('input'))}")
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": block["input"]}})
    msg: dict = {"role": "assistant", "content": "".join(texts)}
    if calls:
        msg["tool_calls"] = calls
    if thinking:
        msg["reasoning_content"] = "".join(thinking)
    return msg


def _messages(raw: object, system: object) -> list[dict]:
    out = [] if system is None else [{"role": "system", "content": _text_blocks(system, "system")}]
    for i, msg in enumerate(expect_items(raw, "messages", "message objects")):
        param = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise RequestError(param, f"expected a message object, got {got(msg)}")
        role = msg.get("role")
        if role not in ROLES:
            raise RequestError(f"{param}.role", f"expected one of {', '.join(ROLES)}, got {got(role)}")
        content = msg.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
        elif not isinstance(content, list):
            raise RequestError(f"{param}.content", f"expected a string or an array of content blocks, got {got(content)}")
        elif role == "user":
            out.extend(_user(content, f"{param}.content"))
        else:
            out.append(_assistant(content, f"{param}.content"))
    return out


def _tools(raw: object) -> list[dict] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise RequestError("tools", f"expected an array of tool objects, got {got(raw)}")
    out = []
    for i, tool in enumerate(raw):
        param = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise RequestError(param, f"expected a tool object with 'name' and 'input_schema', got {got(tool)}")
        if tool.get("type") not in (None, "custom"):
            raise RequestError(f"{param}.type", f"only custom tools are supported, got {got(tool.get('type'))}")
        if tool.get("input_schema") is None:
            raise RequestError(f"{param}.input_schema", "missing required field: input_schema (a JSON schema)")
        fn = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if tool.get("description") is not None:
            fn["description"] = tool["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(raw: object, body: dict) -> None:
    """Sets the OpenAI `tool_choice` and `parallel_tool_calls` of `body`."""
    if raw is None:
        return
    if not isinstance(raw, dict):
        raise RequestError("tool_choice", f"expected an object like {{'type': 'auto'}}, got {got(raw)}")
    kind = raw.get("type")
    if kind not in ("auto", "any", "tool", "none"):
        raise RequestError("tool_choice.type", f"expected one of auto, any, tool, none, got {got(kind)}")
    if kind == "tool":
        if not isinstance(raw.get("name"), str):
            raise RequestError("tool_choice.name", f"expected the tool's name as a string, got {got(raw.get('name'))}")
        body["tool_choice"] = {"type": "function", "function": {"name": raw["name"]}}
    else:
        body["tool_choice"] = {"any": "required"}.get(kind, kind)
    disable = expect_bool(raw.get("disable_parallel_tool_use"), "tool_choice.disable_parallel_tool_use", False)
    body["parallel_tool_calls"] = not disable


def _thinking(raw: object) -> bool:
    if raw is None:
        return False
    if not isinstance(raw, dict):
        raise RequestError("thinking", f"expected an object like {{'type': 'enabled', 'budget_tokens': 2048}}, "
                           f"got {got(raw)}")
    kind = raw.get("type")
    if kind not in ("enabled", "disabled"):
        raise RequestError("thinking.type", f"expected 'enabled' or 'disabled', got {got(kind)}")
    if kind == "enabled" and raw.get("budget_tokens") is None:
        raise RequestError("thinking.budget_tokens", "missing required field: budget_tokens (an integer)")
    expect_int(raw.get("budget_tokens"), "thinking.budget_tokens", 1, None)
    return kind == "enabled"


def parse_messages_request(raw: object, limits: Limits | None = None, max_context: int | None = None) -> ChatRequest:
    if not isinstance(raw, dict):
        raise RequestError(None, f"the request body must be a JSON object, got {got(raw)}")
    body = {k: v for k, v in raw.items() if v is not None}
    if "max_tokens" not in body:
        raise RequestError("max_tokens", "missing required field: max_tokens (the most tokens to generate)")
    expect_number(body.get("temperature"), "temperature", 0.0, 1.0)
    expect_int(body.get("top_k"), "top_k", 0, None)
    chat: dict = {"messages": _messages(body.get("messages"), body.get("system")),
                  "chat_template_kwargs": {"enable_thinking": _thinking(body.get("thinking"))}}
    for key in ("model", "max_tokens", "temperature", "top_p", "top_k", "stream"):
        if key in body:
            chat[key] = body[key]
    if "stop_sequences" in body:
        chat["stop"] = body["stop_sequences"]
        if isinstance(chat["stop"], str):
            raise RequestError("stop_sequences", "expected an array of strings, got a string")
    if (tools := _tools(body.get("tools"))) is not None:
        chat["tools"] = tools
    _tool_choice(body.get("tool_choice"), chat)
    try:
        return parse_chat_request(chat, limits, max_context)
    except RequestError as exc:
        raise RequestError(_anthropic_param(exc.param), exc.message) from None
