"""`GrammarEngine.accepts` on call envelopes: the golden envelope transcripts and the default model's real
fenced replies are accepted under tool_choice "auto"; once a declared tool's name key is written, the
rest of the call is constrained (typed, required present, one object) and fails at the right byte.

Rows mark the failure byte with `@@` as in `test_accepts.py`.
"""

from __future__ import annotations

import pytest

from jaxchat.chat import (
    ChatParseOptions,
    ChatTemplate,
    chat_constraint_request_from_openai,
    chat_format_make,
    chat_format_prefill,
    chat_parse,
    native_call_opening,
)
from tests.api.test_envelope_restart import NATIVE_REST
from tests.api.test_service import WEATHER
from tests.chat.golden import TOOLS as GOLDEN_TOOLS
from tests.chat.golden_envelopes import ENVELOPE_GOLDEN, REAL_FENCED
from tests.constrain.support import TOOLS, make_request

# Golden envelopes the grammar does not admit, and why (every other uncut one must be accepted).
GRAMMAR_SKIPS = {
    # A declared tool's name key in free text must go on as that tool's call (typed arguments object).
    "other_key_is_content": "a declared tool's name key followed by another key",
    "string_arguments_are_content": "a declared tool's name key followed by string-encoded arguments",
}
# Llama 3: a reply opening with `{` is a native bare call, after which nothing follows; the single variant
# (every real Llama 3 template) allows one call per turn.
LLAMA_SKIPS = {"bare_call_lines"}
LLAMA_SINGLE_SKIPS = {"fenced_several_objects", "several_fences", "fenced_array", "bare_array"}


def _auto(tools) -> object:
    return chat_constraint_request_from_openai({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                "tools": list(tools)})


def _cases():
    for g in ENVELOPE_GOLDEN:
        skip = g.cut or g.name in GRAMMAR_SKIPS
        skip = skip or (g.spec.kind == "llama3_json" and g.name in LLAMA_SKIPS)
        skip = skip or (g.spec.kind == "llama3_json" and g.spec.variant == "single" and g.name in LLAMA_SINGLE_SKIPS)
        if not skip:
            yield pytest.param(g, id=g.id)


@pytest.mark.parametrize("golden", list(_cases()))
def test_golden_envelopes_accepted(qwen25, golden):
    ok, at = qwen25.engine.accepts(golden.spec, _auto(GOLDEN_TOOLS), golden.prefill, golden.generated)
    assert (ok, at) == (True, len(golden.generated.encode())), repr(golden.generated.encode()[max(at - 40, 0): at + 20])


@pytest.mark.parametrize(("tool", "text", "args"), REAL_FENCED, ids=["compact", "pretty", "array_value"])
def test_real_fenced_replies_accepted(qwen25, tool, text, args):
    """The default model's replies, with the prefill the Qwen2.5 template's generation prompt leaves."""
    from jaxchat.assets import template_path

    template = ChatTemplate(template_path("Qwen-Qwen2.5-7B-Instruct.jinja").read_text())
    prompt = template.render([{"role": "user", "content": "Find the area of a triangle."}], tools=[tool],
                             add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")
    spec = chat_format_make("hermes_json")
    prefill = chat_format_prefill(spec, prompt[-200:])
    request = _auto([tool])
    assert qwen25.engine.accepts(spec, request, prefill, text) == (True, len(text.encode()))
    msg = chat_parse(spec, prefill + text, False, ChatParseOptions(tools=(tool,), call_envelopes=True))
    assert [(c.name, c.arguments) for c in msg.tool_calls] == [(tool["function"]["name"], __import__("json").dumps(args))]


FENCE = "```json\n"
ROWS = [
    # (kind, mode, text): once the name key is written the call is constrained
    ("hermes_json", "auto", FENCE + '{"name": "get_weather", "arguments": {"city": @@3}}\n```'),
    ("hermes_json", "auto", FENCE + '{"name": "get_weather", "arguments": {"unit": "c"@@}}\n```'),
    ("hermes_json", "auto", FENCE + '{"name": "get_weather", "arguments": {"city": "x", "unit": "@@k"}}\n```'),
    ("hermes_json", "auto", FENCE + '{"name": "get_weather", "arguments": {"city": "x", "@@city": "y"}}\n```'),
    ("hermes_json", "auto", FENCE + '{"name": "get_weather", "arguments": {"city": "x"}@@, "id": 1}\n```'),
    ("hermes_json", "auto", FENCE + '{"name": "get_weather", "@@description": "x"}\n```'),
    ("hermes_json", "auto", FENCE + '{\n  "name": "search",\n  "arguments": {\n    "score": 1,\n    "query": "x",\n'
                                    '    "tags": ["a", "b", "c"@@, "d"]\n  }\n}\n```'),
    ("hermes_json", "auto", 'Then {"name":"get_time", "arguments": @@[]}'),  # mid-line too, and the compact key
    ("llama3_json", "auto", FENCE + '{"name": "get_weather", "parameters": {"days": @@"3"}}\n```'),
    ("mistral:json_array", "auto", FENCE + '[{"name": "get_weather", "arguments": {"city": @@null}}]\n```'),
    # any order, typed: accepted
    ("hermes_json", "auto", FENCE + '{\n  "name": "search",\n  "arguments": {\n    "score": 0.5,\n    "query": "x"\n  }\n}\n```'),
    ("llama3_json", "auto", "Sure.\n" + FENCE + '{"name": "get_weather", "parameters": {"unit": "f", "city": "Rome"}}\n```'),
    # a tool the request may not call (allowed_tools narrows auto) is not even named
    ("hermes_json", "allowed_auto", FENCE + '{"name": "search@@"'),
    # parallel_tool_calls false: one call; text may follow it, a second call may not
    ("hermes_json", "auto_single", FENCE + '{"name": "get_time", "arguments": {}}\n```\nDone.'),
    ("hermes_json", "auto_single", '[{"name": "get_time", "arguments": {}}, {"name": "get_time@@"'),
    ("hermes_json", "auto_single", '{"name": "get_time", "arguments": {}}\n<tool_call@@>'),
    ("llama3_json", "auto", '{"name": "get_time", "parameters": {}}@@\n{"name": "get_time"'),  # nothing after a bare call
    ("llama3_json", "auto", 'Now.\n' + FENCE + '{"name": "get_time", "parameters": {}}\n```<|python_tag|@@>'),
    # under required the format's own syntax is the forced one
    ("hermes_json", "required", "@@" + FENCE + '{"name": "get_time", "arguments": {}}\n```'),
    ("llama3_json", "required", "@@" + FENCE + '{"name": "get_time", "parameters": {}}\n```'),
]
ALLOWED_AUTO = {"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
    {"type": "function", "function": {"name": "get_weather"}}, {"type": "function", "function": {"name": "get_time"}}]}}}


@pytest.mark.parametrize("kind,mode,text", ROWS, ids=[f"{r[0]}-{r[1]}-{i}" for i, r in enumerate(ROWS)])
def test_envelope_rows(qwen25, kind, mode, text):
    name, _, variant = kind.partition(":")
    spec = chat_format_make(name, variant=variant)
    if mode == "allowed_auto":
        request = chat_constraint_request_from_openai({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                       "tools": TOOLS, **ALLOWED_AUTO})
    else:
        request = make_request(mode)
    expected = text.encode().find(b"@@")
    text = text.replace("@@", "")
    ok, at = qwen25.engine.accepts(spec, request, "", text)
    if expected < 0:
        assert (ok, at) == (True, len(text.encode()))
    else:
        assert (ok, at) == (False, expected)


def test_the_restart_grammar_takes_the_native_opening_and_calls_only(qwen25):
    """A reply that opened with an envelope restarts from `native_call_opening` (`jaxchat.api.envelope_restart`)
    under the request's grammar for tool_choice "required": started after the opening (less its trailing
    space), it takes the native call and a second one, types the arguments, and allows no text after them."""
    spec = chat_format_make("hermes_json")
    request = chat_constraint_request_from_openai({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                   "tools": [WEATHER], "tool_choice": "required"})
    opening = native_call_opening(spec, "get_weather").rstrip(" ")  # the restart leaves the space to the model
    rest = " " + NATIVE_REST
    assert qwen25.engine.accepts(spec, request, opening, rest) == (True, len(rest.encode()))
    for bad in (' {"town": "Paris"}}', rest + "\n</tool_call", rest + '\n{"name": "get_weather"'):
        ok, _ = qwen25.engine.accepts(spec, request, opening, bad)
        assert not ok, bad
