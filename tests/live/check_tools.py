"""Live checks: every tool_choice mode, parallel_tool_calls, strict tools, response_format conformance.

Usage: python tests/live/check_tools.py --base-url http://127.0.0.1:8000 --model MODEL [--api-key KEY]
Standard library only. A mode is honoured when: none → no tool calls; auto → any calls are to
declared tools with JSON-object arguments; required → at least one call and finish_reason
"tool_calls"; named → every call is the named function; parallel_tool_calls false → at most one
call; strict → arguments conform to the tool's schema; json_schema → content parses and conforms.
"""

from __future__ import annotations

import json
import sys

try:
    from . import livelib as lib
except ImportError:  # run as a script
    import livelib as lib

expect = lib.expect

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "strict": True,
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city", "unit"],
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time in a timezone",
        "parameters": {"type": "object", "required": ["timezone"], "properties": {"timezone": {"type": "string"}}},
    },
}
TOOLS = [WEATHER, TIME]
ASK = "What is the weather in Paris in celsius, and what time is it in Europe/Paris? Use the tools get_weather and get_time."
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def _calls(ctx: lib.Context, **fields) -> tuple[list[dict], str, dict]:
    """Calls from a plain request and from its stream (which must agree); returns (calls, finish, message)."""
    body = ctx.chat(ASK, tools=TOOLS, think=False, **fields)
    msg, finish = body["choices"][0]["message"], body["choices"][0]["finish_reason"]
    calls = lib.message_calls(msg)
    for call in calls:
        expect(isinstance(call["id"], str) and call["id"], f"tool call without id: {call}")
        expect(call["name"] in SCHEMAS, f"call to an undeclared tool {call['name']!r}")
        try:
            args = json.loads(call["arguments"])
        except ValueError:
            raise lib.CheckFailed(f"arguments are not JSON: {call['arguments']!r}") from None
        expect(isinstance(args, dict), f"arguments are not a JSON object: {call['arguments']!r}")
    if calls:
        expect(msg.get("content") in (None, "") or isinstance(msg.get("content"), str), "content with tool calls")
        expect(finish == "tool_calls", f"tool calls but finish_reason {finish!r}")
    return calls, finish, msg


def check_none(ctx: lib.Context) -> None:
    calls, finish, msg = _calls(ctx, tool_choice="none")
    expect(not calls, f"tool_choice none produced calls: {calls}")
    expect(isinstance(msg.get("content"), str) and finish in ("stop", "length"), "tool_choice none: a text reply")


def check_auto(ctx: lib.Context) -> None:
    _calls(ctx, tool_choice="auto")
    _calls(ctx)  # the default


def check_required(ctx: lib.Context) -> None:
    calls, finish, _ = _calls(ctx, tool_choice="required")
    expect(calls and finish == "tool_calls", f"tool_choice required: no call (finish_reason {finish!r})")
    for call in calls:
        if call["name"] == "get_weather":  # strict: schema-valid arguments
            errors = lib.schema_errors(json.loads(call["arguments"]), SCHEMAS["get_weather"])
            expect(not errors, f"strict tool arguments invalid: {errors}")


def check_named(ctx: lib.Context) -> None:
    for name in ("get_time", "get_weather"):
        calls, _, _ = _calls(ctx, tool_choice={"type": "function", "function": {"name": name}})
        expect(calls and all(c["name"] == name for c in calls), f"named {name}: calls {[c['name'] for c in calls]}")
        errors = lib.schema_errors(json.loads(calls[0]["arguments"]), SCHEMAS[name])
        expect(not errors, f"named {name}: arguments do not match the schema: {errors}")


def check_parallel_off(ctx: lib.Context) -> None:
    for choice in ("required", "auto"):
        calls, _, _ = _calls(ctx, tool_choice=choice, parallel_tool_calls=False)
        expect(len(calls) <= 1, f"parallel_tool_calls false, tool_choice {choice}: {len(calls)} calls")


def check_stream_tool_calls(ctx: lib.Context) -> None:
    _, acc = ctx.chat_stream(ASK, tools=TOOLS, tool_choice="required", think=False)
    calls = acc[0]["tool_calls"]
    expect(calls and all(c["id"] and c["name"] in SCHEMAS for c in calls), f"streamed calls {calls}")
    for call in calls:
        expect(isinstance(json.loads(call["arguments"]), dict), "streamed arguments join into a JSON object")
    expect(acc[0]["finish_reason"] == "tool_calls", f"streamed finish_reason {acc[0]['finish_reason']!r}")


PERSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "age", "languages"],
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "languages": {"type": "array", "items": {"type": "string"}, "minItems": 1},
    },
}


def check_json_schema(ctx: lib.Context) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON}}
    ask = "Describe a fictional programmer as JSON with name, age and languages."
    body = ctx.chat(ask, response_format=fmt, think=False)
    content = body["choices"][0]["message"]["content"]
    expect(
        body["choices"][0]["finish_reason"] == "stop",
        f"json_schema: finish_reason {body['choices'][0]['finish_reason']!r}",
    )
    try:
        value = json.loads(content)
    except (TypeError, ValueError):
        raise lib.CheckFailed(f"json_schema: content is not JSON: {content!r}") from None
    errors = lib.schema_errors(value, PERSON)
    expect(not errors, f"json_schema: content does not conform: {errors}")
    _, acc = ctx.chat_stream(ask, response_format=fmt, think=False)
    expect(
        not lib.schema_errors(json.loads(acc[0]["content"]), PERSON), "json_schema: streamed content does not conform"
    )


def check_json_object(ctx: lib.Context) -> None:
    body = ctx.chat("Give me a JSON object with a key 'answer'.", response_format={"type": "json_object"}, think=False)
    content = body["choices"][0]["message"]["content"]
    try:
        value = json.loads(content)
    except (TypeError, ValueError):
        raise lib.CheckFailed(f"json_object: content is not JSON: {content!r}") from None
    expect(isinstance(value, dict), "json_object: content is not an object")


CHECKS = [
    ("tools.none", check_none),
    ("tools.auto", check_auto),
    ("tools.required_strict", check_required),
    ("tools.named", check_named),
    ("tools.parallel_off", check_parallel_off),
    ("tools.stream", check_stream_tool_calls),
    ("format.json_schema", check_json_schema),
    ("format.json_object", check_json_object),
]

if __name__ == "__main__":
    sys.exit(lib.main_for(CHECKS, description=__doc__))
