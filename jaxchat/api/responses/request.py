"""Read an OpenAI Responses API body (`POST /v1/responses`) once, into a chat request on the same pipeline.

Contract
--------
`parse_responses_request(body, limits, max_context=None) -> ResponsesRequest` is pure and raises every
400 about the body as `RequestError` whose `param` is spelled the Responses way (`input[2].call_id`,
`tools[0].parameters`, `text.format.schema`, `reasoning.effort`, `max_output_tokens`). It converts the
body into a chat completions body and reads that with `parse_chat_request` (so the messages, sampling
and constraint checks, `chat_constraint_request_from_openai` included, run exactly once and exactly as
for chat); the result's `chat` is that `ChatRequest`, which the service runs through the same template,
grammar, engine and parser. Conversion: `instructions` becomes a first system message; `input` is a
string (one user message) or items: messages (`input_text` / `output_text` parts, any role), a
`reasoning` item (its summary or content text becomes the next assistant turn's reasoning),
`function_call` / `custom_tool_call` (joins the assistant turn before it, or opens one) and
`function_call_output` / `custom_tool_call_output` (a tool message). `tools` are function and custom tools
in the flat Responses shape (custom: `format` `text` or `{"type": "grammar", "syntax", "definition"}`);
`tool_choice` is a mode, `{"type": "function" | "custom", "name"}` or `{"type": "allowed_tools", "mode",
"tools"}`; `text.format` is `text`,
`json_object` or `json_schema`; `reasoning.effort` "none" switches thinking off; `max_output_tokens`,
`temperature`, `top_p`, `parallel_tool_calls` and `stream` read as in chat. The API is stateless:
`previous_response_id`, `conversation`, an `item_reference`, `store: true` and `background: true`
are 400s naming the field. A null field reads as absent; unknown fields are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxchat.api.limits import Limits
from jaxchat.api.request import ChatRequest, parse_chat_request
from jaxchat.chat.errors import RequestError, expect_bool, expect_object, expect_str, got

__all__ = ["ResponsesRequest", "parse_responses_request"]

ROLES = ("user", "system", "developer", "assistant")
_STATEFUL = {
    "previous_response_id": "this server keeps no responses: send the whole conversation as `input` instead",
    "conversation": "this server keeps no conversations: send the whole conversation as `input` instead",
}
# chat param prefix -> Responses param prefix (longest first), for errors raised by the chat reader
_PARAMS = (
    ("tool_choice.allowed_tools.tools", "tool_choice.tools"),
    ("tool_choice.allowed_tools.mode", "tool_choice.mode"),
    ("tool_choice.allowed_tools", "tool_choice"),
    ("tool_choice.function", "tool_choice"),
    ("tool_choice.custom", "tool_choice"),
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("reasoning_effort", "reasoning.effort"),
    ("max_completion_tokens", "max_output_tokens"),
)


@dataclass(frozen=True)
class ResponsesRequest:
    chat: ChatRequest  # what the pipeline runs
    echo: dict  # the request's fields a Response object repeats (instructions, tools, tool_choice, text, ...)

    @property
    def stream(self) -> bool:
        return self.chat.stream


def parse_responses_request(raw: object, limits: Limits | None = None,
                            max_context: int | None = None) -> ResponsesRequest:
    limits = limits or Limits()
    if not isinstance(raw, dict):
        raise RequestError(None, f"the request body must be a JSON object, got {got(raw)}")
    body = {k: v for k, v in raw.items() if v is not None}
    for key, why in _STATEFUL.items():
        if key in body:
            raise RequestError(key, f"{key} is not supported: {why}")
    for key in ("store", "background"):
        if expect_bool(body.get(key), key, False):
            raise RequestError(key, f"{key}: true is not supported: this server is stateless (leave it out or "
                               "set it to false)")
    instructions = expect_str(body.get("instructions"), "instructions")
    messages, sources = _input(body.get("input"), instructions, limits)
    text = expect_object(body.get("text", {}), "text", "an object like {'format': {'type': 'text'}}")
    reasoning = expect_object(body.get("reasoning", {}), "reasoning", "an object like {'effort': 'low'}")
    chat = {
        "messages": messages,
        "model": body.get("model"),
        "stream": body.get("stream"),
        "max_completion_tokens": body.get("max_output_tokens"),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "tools": _tools(body.get("tools")),
        "tool_choice": _tool_choice(body.get("tool_choice")),
        "parallel_tool_calls": body.get("parallel_tool_calls"),
        "response_format": _format(text.get("format")),
        "reasoning_effort": reasoning.get("effort"),
    }
    try:
        request = parse_chat_request({k: v for k, v in chat.items() if v is not None}, limits, max_context)
    except RequestError as exc:
        raise RequestError(_param(exc.param, sources), exc.message) from None
    echo = {
        "instructions": instructions,
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": request.constraint.parallel_tool_calls,
        "text": {"format": text.get("format") or {"type": "text"}},
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "temperature": request.sampling.temperature,
        "top_p": request.sampling.top_p,
        "max_output_tokens": request.sampling.max_tokens,
        "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
        "store": False,
    }
    return ResponsesRequest(request, echo)


def _param(param: str | None, sources: list[str]) -> str | None:
    if param is None:
        return None
    if param.startswith("messages[") and "]" in param:
        index, rest = param[len("messages["):].split("]", 1)
        return sources[int(index)] + rest if index.isdigit() and int(index) < len(sources) else "input"
    if param.startswith("messages"):
        return "input" + param[len("messages"):]
    if param.startswith("tools[") and ".function" in param:
        return param.replace(".function", "", 1)
    if param.startswith("tools[") and ".custom" in param:
        return param.replace(".custom", "", 1).replace(".format.grammar.", ".format.", 1)
    for chat, responses in _PARAMS:
        if param.startswith(chat):
            return responses + param[len(chat):]
    return param


# ---- the body's parts, as a chat body's ----------------------------------------------------------------
def _tools(raw: object) -> object:
    if not isinstance(raw, list):
        return raw  # the chat reader names what is wrong with it
    out = []
    for i, tool in enumerate(raw):
        if isinstance(tool, dict) and tool.get("type") == "custom":
            tool = {"type": "custom", "custom": _custom_tool(tool, f"tools[{i}]")}
        elif isinstance(tool, dict):
            if tool.get("type") != "function":
                raise RequestError(f"tools[{i}].type",
                                   f"expected a 'function' or 'custom' tool, got {got(tool.get('type'))}")
            tool = {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
        out.append(tool)
    return out


def _custom_tool(tool: dict, param: str) -> dict:
    """A Responses custom tool (`{"type": "custom", "name", "description", "format": {"type": "grammar",
    "syntax", "definition"}}`) in the Chat Completions shape."""
    fmt = tool.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        fmt = {"type": "grammar", "grammar": {"syntax": fmt.get("syntax"), "definition": fmt.get("definition")}}
    return {k: v for k, v in (("name", tool.get("name")), ("description", tool.get("description")),
                              ("format", fmt)) if v is not None}


def _ref(ref: object) -> object:
    """A flat tool reference `{"type": "function" | "custom", "name"}` in the Chat Completions shape."""
    if isinstance(ref, dict) and ref.get("type") in ("function", "custom"):
        return {"type": ref["type"], ref["type"]: {"name": ref.get("name")}}
    return ref


def _tool_choice(raw: object) -> object:
    if not isinstance(raw, dict):
        return raw
    kind = raw.get("type")
    if kind in ("function", "custom"):
        return _ref(raw)
    if kind == "allowed_tools":
        tools = raw.get("tools")
        if isinstance(tools, list):
            tools = [_ref(t) for t in tools]
        return {"type": "allowed_tools", "allowed_tools": {"mode": raw.get("mode"), "tools": tools}}
    raise RequestError("tool_choice.type", f"expected 'function', 'custom' or 'allowed_tools', got {got(kind)}")


def _format(raw: object) -> object:
    if not isinstance(raw, dict) or raw.get("type") != "json_schema":
        return raw
    keys = ("name", "schema", "strict", "description")
    return {"type": "json_schema", "json_schema": {k: raw[k] for k in keys if raw.get(k) is not None}}


def _input(raw: object, instructions: str | None, limits: Limits) -> tuple[list[dict], list[str]]:
    """The chat messages and, for each, the Responses param it came from."""
    messages: list[dict] = [{"role": "system", "content": instructions}] if instructions else []
    sources = ["instructions"] if instructions else []
    if raw is None:
        raise RequestError("input", "missing required field: input (a string or an array of input items)")
    if isinstance(raw, str):
        return [*messages, {"role": "user", "content": raw}], [*sources, "input"]
    if not isinstance(raw, list):
        raise RequestError("input", f"expected a string or an array of input items, got {got(raw)}")
    if not raw:
        raise RequestError("input", "input must not be empty")
    if len(raw) > limits.max_messages:
        raise RequestError("input", f"at most {limits.max_messages} input items are allowed, got {len(raw)}")
    reasoning, names, turn_open = "", {}, False  # turn_open: the last message is an assistant turn calls may join
    for i, item in enumerate(raw):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise RequestError(param, f"expected an input item object, got {got(item)}")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "reasoning":
            reasoning += _reasoning_text(item, param)
            continue
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise RequestError(f"{param}.role", f"expected one of {', '.join(ROLES)}, got {got(role)}")
            msg = {"role": role, "content": _text(item.get("content"), f"{param}.content")}
        elif kind in ("function_call", "custom_tool_call"):
            call_id = _required_str(item, "call_id", param)
            name = _required_str(item, "name", param)
            names[call_id] = name
            if kind == "custom_tool_call":
                call = {"id": call_id, "type": "custom",
                        "custom": {"name": name, "input": _required_str(item, "input", param, empty=True)}}
            else:
                arguments = _required_str(item, "arguments", param, empty=True)
                call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            if turn_open and not reasoning:
                messages[-1].setdefault("tool_calls", []).append(call)
                continue
            msg = {"role": "assistant", "content": None, "tool_calls": [call]}
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = _required_str(item, "call_id", param)
            msg = {"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), f"{param}.output")}
            if call_id in names:
                msg["name"] = names[call_id]
        elif kind == "item_reference":
            raise RequestError(f"{param}.type", "item_reference is not supported: this server keeps no items, "
                               "send the item itself")
        else:
            raise RequestError(f"{param}.type", "expected 'message', 'function_call', 'function_call_output', "
                               f"'custom_tool_call', 'custom_tool_call_output' or 'reasoning', got {got(kind)}")
        turn_open = msg["role"] == "assistant"
        if turn_open and reasoning:
            msg["reasoning_content"], reasoning = reasoning, ""
        messages.append(msg)
        sources.append(param)
    return messages, sources


def _required_str(item: dict, key: str, param: str, empty: bool = False) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not (value or empty):
        raise RequestError(f"{param}.{key}", f"expected a {'' if empty else 'non-empty '}string, got {got(value)}")
    return value


def _text(content: object, param: str) -> str:
    """A string, or the text of an array of text parts (`input_text`, `output_text`, `text`)."""
    if content is None:
        raise RequestError(param, "missing required field: a string or an array of text parts")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RequestError(param, f"expected a string or an array of text parts, got {got(content)}")
    parts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise RequestError(f"{param}[{j}]", f"expected a content part object, got {got(part)}")
        if part.get("type") not in ("input_text", "output_text", "text"):
            raise RequestError(f"{param}[{j}].type", f"only text parts are supported, got {got(part.get('type'))}")
        if not isinstance(part.get("text"), str):
            raise RequestError(f"{param}[{j}].text", f"expected a string, got {got(part.get('text'))}")
        parts.append(part["text"])
    return "".join(parts)


def _reasoning_text(item: dict, param: str) -> str:
    texts = []
    for key in ("content", "summary"):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise RequestError(f"{param}.{key}", f"expected an array of text parts, got {got(parts)}")
        for j, part in enumerate(parts):
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                raise RequestError(f"{param}.{key}[{j}]", f"expected a part with a string 'text', got {got(part)}")
            texts.append(part["text"])
        if texts:  # the raw content when it is there, else the summary
            break
    return "\n".join(texts)
