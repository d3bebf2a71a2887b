"""`GrammarEngine.accepts`: valid outputs per format are accepted; violations fail at the right byte.

Tables are (format kind, request mode, response_format, prefill, text, expected failure byte or None);
add hand-written cases by appending rows. The chat library's golden transcripts (`tests/chat/golden.py`)
are checked too: each one valid under tool_choice auto with their tools is accepted. The failure byte is given as the index of a marker string
`@@` in the text (removed before feeding), so rows stay readable.
"""

from __future__ import annotations

import pytest

from jaxchat.chat import chat_constraint_request_from_openai, chat_format_make
from jaxchat.constrain import text_markers
from tests.constrain.support import make_request

CALL_W = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>'
CALL_T = '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
ROWS = [
    # valid outputs
    ("hermes_json", "auto", "text", "", "Let me check. " + CALL_W),
    ("hermes_json", "auto", "text", "", "Just prose."),
    ("hermes_json", "required", "text", "", CALL_W + "\n" + CALL_T),
    ("qwen_xml", "auto", "text", "", ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                                      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")),
    ("lfm2", "auto", "text", "", '<|tool_call_start|>[get_weather(city="Paris", unit="f"), get_time()]<|tool_call_end|>'),
    ("lfm2", "auto", "text", "", "<|tool_call_start|>[get_weather(city='Paris', unit='c')]<|tool_call_end|>"),
    ("qwen_xml", "auto", "text", "", "<tool_call>\n<function=get_time>\n</function>\n</tool_call>"),
    ("gemma4", "auto", "text", "", "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:2}<tool_call|>"),
    ("harmony", "auto", "text", "assistant", ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>"
                                              "commentary to=functions.get_weather <|constrain|>json<|message|>"
                                              "{\"city\": \"Paris\"}<|call|>")),
    ("harmony", "auto", "text", "assistant", "<|channel|>final<|message|>Hello!<|return|>"),
    ("plain", "none", "json_schema", "", '{"answer": "42", "confidence": 3}'),
    # violations: @@ marks the byte where the grammar must fail
    ("hermes_json", "required", "text", "", "@@Sure, " + CALL_W),
    ("hermes_json", "auto_single", "text", "", CALL_W + "@@\n" + CALL_T),
    ("hermes_json", "named", "text", "", '<tool_call>\n{"name": "@@get_weather"'),
    ("hermes_json", "auto", "text", "", '<tool_call>\n{"name": "get_weather", "arguments": {"unit": "c"@@}}'),
    ("hermes_json", "auto", "text", "", '<tool_call>\n{"name": "get_weather", "arguments": {"city": @@3}}'),
    ("hermes_json", "auto", "text", "", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "x", "unit": "@@k"}}'),
    ("hermes_json", "auto", "text", "", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "x", "hourly":    @@  true}}'),
    ("hermes_json", "auto", "text", "", '<tool_call>\n{"name": "search", "arguments": {"query": "x", "score": 1234567890123456@@7}}'),
    ("lfm2", "auto", "text", "", '<|tool_call_start|>[search(query="x", score=1234567890123456@@7)]'),
    ("lfm2", "auto", "text", "", '<|tool_call_start|>[get_weather(unit="c"@@)]'),
    ("plain", "none", "json_schema", "", '{"answer": "42", "confidence": 3}@@ trailing'),
    # markers the parser acts on never appear inside strings (spelled out or as one token)
    ("hermes_json", "auto", "text", "", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a<@@|im_end|>"}}'),
    ("hermes_json", "auto", "text", "", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "a</tool_call@@>"}}'),
    ("hermes_json", "auto", "json_object", "", '{"a": "<tool_call@@>"}'),
    ("qwen_xml", "auto", "text", "", "<tool_call>\n<function=get_weather>\n<parameter=city>\nP</tool_call@@>"),
    ("harmony", "auto", "text", "assistant", '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "<@@|call|>"}'),
    ("plain", "none", "json_schema", "", '{"answer": "<@@|im_end|>", "confidence": 3}'),
    ("plain", "none", "json_schema", "", '@@Here: {"answer": "42", "confidence": 3}'),
]


@pytest.mark.parametrize("kind,mode,rf,prefill,text", ROWS, ids=[f"{r[0]}-{r[1]}-{i}" for i, r in enumerate(ROWS)])
def test_accepts(qwen25, kind, mode, rf, prefill, text):
    spec = chat_format_make(kind)
    request = make_request(mode, rf, tools=kind != "plain")
    expected = text.encode().find(b"@@")
    text = text.replace("@@", "")
    ok, at = qwen25.engine.accepts(spec, request, prefill, text)
    if expected < 0:
        assert (ok, at) == (True, len(text.encode()))
    else:
        assert (ok, at) == (False, expected)


# -- the chat library's golden transcripts ----------------------------------------------------------

# Golden transcripts the grammar cannot express, and why (every other non-`cut_*` one must be accepted).
GOLDEN_SKIPS = {
    # The grammar writes arguments as a JSON object; a JSON string holding JSON is a parser leniency.
    "hermes_json:string_encoded_arguments": "arguments encoded as a JSON string",
    # A commentary preamble message before the call: the harmony grammar (like xgrammar's builtin
    # harmony style) allows only analysis messages before the final message or the call.
    "harmony:preamble_then_call": "commentary preamble before a call",
}


def _golden_cases():
    from tests.chat.golden import GOLDEN

    for g in GOLDEN:
        if not g.cut and g.id not in GOLDEN_SKIPS:
            yield pytest.param(g, id=g.id)


@pytest.mark.parametrize("golden", list(_golden_cases()))
def test_golden_accepted(qwen25, golden):
    """tool_choice auto with the goldens' tools and reasoning allowed: every golden turn is accepted.
    A trailing end-of-turn marker (`<|im_end|>`, Gemma's `<|tool_response>`) is the stop token the
    engine emits as a token, not text the grammar reads, so it is cut off first (Harmony's
    `<|call|>`/`<|return|>` are text the grammar matches, and stay)."""
    from tests.chat.golden import TOOLS

    request = chat_constraint_request_from_openai(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": list(TOOLS)})
    generated = golden.generated
    stops = [m for m in (*golden.spec.stop_markers, *golden.spec.extra_stops) if m not in text_markers(golden.spec)]
    for stop in stops:
        if stop in generated:
            generated = generated[: generated.index(stop)]
    ok, at = qwen25.engine.accepts(golden.spec, request, golden.prefill, generated)
    assert (ok, at) == (True, len(generated.encode())), repr(generated.encode()[max(at - 40, 0): at + 20])
