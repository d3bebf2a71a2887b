"""`GrammarEngine.accepts`: valid outputs per format are accepted; violations fail at the right byte.

Tables are (format kind, request mode, response_format, prefill, text, expected failure byte or None);
add golden transcripts by appending rows. The failure byte is given as the index of a marker string
`@@` in the text (removed before feeding), so rows stay readable.
"""

from __future__ import annotations

import pytest

from jaxchat.chat import chat_format_make
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
    ("hermes_json", "auto", "text", "", '<tool_call>\n{"name": "get_weather", "arguments": {"@@unit": "c"}}'),
    ("hermes_json", "auto", "text", "", '<tool_call>\n{"name": "get_weather", "arguments": {"city": @@3}}'),
    ("hermes_json", "auto", "text", "", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "x", "unit": "@@k"}}'),
    ("hermes_json", "auto", "text", "", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "x", "hourly":    @@  true}}'),
    ("hermes_json", "auto", "text", "", '<tool_call>\n{"name": "search", "arguments": {"query": "x", "score": 1234567890123456@@7}}'),
    ("lfm2", "auto", "text", "", '<|tool_call_start|>[search(query="x", score=1234567890123456@@7)]'),
    ("lfm2", "auto", "text", "", '<|tool_call_start|>[get_weather(@@unit="c")]'),
    ("plain", "none", "json_schema", "", '{"answer": "42", "confidence": 3}@@ trailing'),
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
