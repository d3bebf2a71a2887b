"""Golden transcripts of call envelopes: tool calls written as fenced or bare JSON in the content, for
every JSON-call kind (`chat.spec.ENVELOPES`), read with `ChatParseOptions.call_envelopes`.

Each is a `tests.chat.golden.Golden` (same tools, `TOOLS`); `cut` is "envelope" when the text ends
before the envelope is decided, "call" when it ends inside a decided call. The shapes are the ones
small models write: Qwen2.5-Coder-0.5B-Instruct answers a tool request with a pretty-printed
```json fence (see `REAL_FENCED`), others write compact or bare JSON, arrays, several calls.
"""

from __future__ import annotations

import json

from tests.chat.golden import (
    HERMES,
    HERMES_NO_THINK,
    LLAMA3,
    LLAMA3_SEMICOLON,
    MISTRAL_ARRAY,
    NESTED_ARGS,
    WEATHER,
    Golden,
)

SPECS = (HERMES_NO_THINK, HERMES, LLAMA3, LLAMA3_SEMICOLON, MISTRAL_ARRAY)
GET_TIME = ("get_time", {})


def compact(name: str, args: dict, key: str = "arguments") -> str:
    return json.dumps({"name": name, key: args}, ensure_ascii=False)


def pretty(name: str, args: dict, indent: int = 2) -> str:
    return json.dumps({"name": name, "arguments": args}, ensure_ascii=False, indent=indent)


def fence(body: str, language: str = "json") -> str:
    return f"```{language}\n{body}\n```"


def _g(spec, name, generated, content="", calls=(), cut="", prefill="") -> Golden:
    return Golden(name, spec, prefill, generated, "", content, tuple(calls), cut)


def _envelopes(spec) -> list[Golden]:
    weather = ("get_weather", WEATHER)
    w_pretty, w_compact = pretty("get_weather", WEATHER), compact("get_weather", WEATHER)
    t_compact = compact("get_time", {})
    undecided = 'Sure.\n```json\n{\n  "name": "get_wea'
    in_call = '```json\n{"name": "get_weather", "arguments": {"city": "Pa'
    john = fence(json.dumps({"name": "John", "age": 30}, indent=2))
    return [
        _g(spec, "fenced_pretty", fence(w_pretty), calls=[weather]),
        _g(spec, "fenced_compact", fence(w_compact), calls=[weather]),
        _g(spec, "fenced_no_language", fence(w_compact, ""), calls=[weather]),
        _g(spec, "fenced_parameters_key", fence(compact("get_time", {}, "parameters")), calls=[GET_TIME]),
        _g(spec, "fenced_nested_unicode", fence(pretty("search", NESTED_ARGS)), calls=[("search", NESTED_ARGS)]),
        _g(spec, "fenced_several_objects", fence(w_pretty + "\n" + t_compact), calls=[weather, GET_TIME]),
        _g(spec, "several_fences", fence(w_compact) + "\n\n" + fence(t_compact), calls=[weather, GET_TIME]),
        _g(spec, "fenced_array", fence(json.dumps([json.loads(w_compact), json.loads(t_compact)], indent=2)),
           calls=[weather, GET_TIME]),
        _g(spec, "bare_array", f"[{w_compact}, {t_compact}]", calls=[weather, GET_TIME]),
        _g(spec, "bare_call_lines", f"{t_compact}\n{w_compact}", calls=[GET_TIME, weather]),
        _g(spec, "text_before", "Let me check the weather.\n" + fence(w_pretty), content="Let me check the weather.",
           calls=[weather]),
        _g(spec, "text_around", "Checking.\n\n" + fence(w_compact) + "\nI will report back.",
           content="Checking.\n\nI will report back.", calls=[weather]),
        _g(spec, "text_then_bare_call", "One moment.\n" + t_compact, content="One moment.", calls=[GET_TIME]),
        _g(spec, "json_answer_naming_no_tool", "Here it is:\n" + john, content="Here it is:\n" + john),
        _g(spec, "code_fence_is_content", "Run:\n```python\nprint({'name': 1})\n```",
           content="Run:\n```python\nprint({'name': 1})\n```"),
        _g(spec, "call_shaped_mid_line_is_content", f"Send {t_compact} to ask.", content=f"Send {t_compact} to ask."),
        _g(spec, "other_key_is_content", fence('{"name": "get_time", "description": "x"}'),
           content=fence('{"name": "get_time", "description": "x"}')),
        _g(spec, "escaped_name_is_content", fence('{"name": "get\\u005ftime", "arguments": {}}'),
           content=fence('{"name": "get\\u005ftime", "arguments": {}}')),
        _g(spec, "string_arguments_are_content", fence('{"name": "get_time", "arguments": "{}"}'),
           content=fence('{"name": "get_time", "arguments": "{}"}')),
        _g(spec, "unclosed_fence_after_call", fence(w_compact)[:-3], calls=[weather]),
        _g(spec, "cut_undecided_envelope", undecided, content=undecided, cut="envelope"),
        _g(spec, "cut_in_envelope_call", in_call, content=in_call, cut="call"),
    ]


def _reasoning() -> list[Golden]:
    body = "Need the weather.\n</think>\n\n" + fence(pretty("get_weather", WEATHER))
    return [Golden("reasoning_then_fenced_call", HERMES, "<think>\n", body, "Need the weather.", "",
                   (("get_weather", WEATHER),))]


ENVELOPE_GOLDEN: list[Golden] = [g for spec in SPECS for g in _envelopes(spec)] + _reasoning()

# The default model's (Qwen2.5-Coder-0.5B-Instruct Q4_K_M) own replies under tool_choice "auto" to BFCL
# v4's simple_python_0 (the one quoted in issue 36, compact, and as the model writes it at temperature 0)
# and parallel_40, with the tools those requests declared.
TRIANGLE = {"type": "function", "function": {"name": "calculate_triangle_area", "parameters": {
    "type": "object", "properties": {"base": {"type": "integer"}, "height": {"type": "integer"},
                                     "unit": {"type": "string"}}, "required": ["base", "height"]}}}
MUSEUM = {"type": "function", "function": {"name": "museum_exhibition_detail", "parameters": {
    "type": "object", "properties": {
        "exhibition_name": {"type": "string"}, "museum_name": {"type": "string"},
        "visitor_type": {"type": "array", "items": {"type": "string", "enum": ["child", "adult"]}}},
    "required": ["exhibition_name", "museum_name"]}}}
REAL_FENCED = [
    (TRIANGLE, '```json\n{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}\n```',
     {"base": 10, "height": 5}),
    (TRIANGLE, '```json\n{\n  "name": "calculate_triangle_area",\n  "arguments": {\n    "base": 10,\n    "height": 5,\n'
               '    "unit": "units"\n  }\n}\n```', {"base": 10, "height": 5, "unit": "units"}),
    (MUSEUM, '```json\n{\n  "name": "museum_exhibition_detail",\n  "arguments": {\n    "exhibition_name": "Wonder of '
             'Nature",\n    "museum_name": "Louvre Museum",\n    "visitor_type": ["child", "adult"]\n  }\n}\n```',
     {"exhibition_name": "Wonder of Nature", "museum_name": "Louvre Museum", "visitor_type": ["child", "adult"]}),
]
