"""`GrammarEngine.accepts`: valid outputs per format are accepted; violations fail at the right byte.

Tables are (format kind[:variant], request mode, response_format, prefill, text, expected failure byte or None);
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
LLAMA_W = '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}}'
LLAMA_T = '{"name": "get_time", "parameters": {}}'
R1_W = '<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{"city": "Paris"}\n```<｜tool▁call▁end｜>'
R1_T = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜>"
V31_W = '<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>'
V31_T = "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
DS_END = "<｜tool▁calls▁end｜>"


def deepseek_r1_block(*calls: str) -> str:
    return "<｜tool▁calls▁begin｜>" + "\n".join(calls) + DS_END


def deepseek_v31_block(*calls: str) -> str:
    return "<｜tool▁calls▁begin｜>" + "".join(calls) + DS_END


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
    # llama3_json (kind:variant), mistral, deepseek_v3
    ("llama3_json", "auto", "text", "", LLAMA_W),
    ("llama3_json", "auto", "text", "", "It is sunny in Paris."),
    ("llama3_json", "auto", "text", "", "Let me check.<|python_tag|>" + LLAMA_T),
    ("llama3_json", "required", "text", "", "<|python_tag|>" + LLAMA_W),
    ("llama3_json", "none", "json_object", "", '{"answer": "42"}'),
    ("llama3_json:semicolon", "required", "text", "", LLAMA_W + "; " + LLAMA_T),
    ("llama3_json", "auto", "text", "", LLAMA_W + "@@; " + LLAMA_T),  # the single variant: one call
    ("llama3_json:semicolon", "auto_single", "text", "", LLAMA_W + "@@; " + LLAMA_T),
    ("llama3_json", "auto", "text", "", '{"@@answer": 1}'),  # a turn opening with '{' is a call
    ("llama3_json", "auto", "text", "", "<|python_tag|>" + LLAMA_T + "@@ Done."),
    ("llama3_json", "auto", "text", "", "<|python_tag|>@@brave_search.call(query='x')"),
    ("llama3_json", "required", "text", "", "@@Sure."),
    ("llama3_json", "named", "text", "", '{"name": "@@get_weather"'),
    ("llama3_json", "auto", "text", "", '{"name": "get_weather", "parameters": {"city": "a<@@|eot_id|>"}}'),
    ("mistral", "auto", "text", "", 'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}'),
    ("mistral", "required", "text", "", "[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{}"),
    ("mistral:json_array", "auto", "text", "",
     '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}, {"name": "get_time", "arguments": {}}]'),
    ("mistral", "required", "text", "", '@@Sure.[TOOL_CALLS]get_time[ARGS]{}'),
    ("mistral", "auto", "text", "", '[TOOL_CALLS]get_weather[ARGS]{"city": @@3}'),
    ("mistral", "auto", "text", "", "[TOOL_CALLS]get_time[CALL_ID]abc@@[ARGS]{}"),
    ("mistral", "auto", "text", "", "[TOOL_CALLS]@@nope[ARGS]{}"),
    ("mistral", "auto_single", "text", "", "[TOOL_CALLS]get_time[ARGS]{}@@[TOOL_CALLS]get_time[ARGS]{}"),
    ("mistral", "auto", "text", "", '[TOOL_CALLS]get_weather[ARGS]{"city": "a</s@@>"}'),
    ("mistral:json_array", "auto_single", "text", "", '[TOOL_CALLS][{"name": "get_time", "arguments": {}}@@, '),
    ("deepseek_v3", "auto", "text", "", "Checking." + deepseek_r1_block(R1_W, R1_T)),
    ("deepseek_v3:v3_1", "required", "text", "", deepseek_v31_block(V31_W, V31_T)),
    ("deepseek_v3", "auto", "text", "", deepseek_r1_block(R1_W)[:-len(DS_END)] + "@@Done"),
    ("deepseek_v3", "required", "text", "", "@@Sure." + deepseek_r1_block(R1_T)),
    ("deepseek_v3:v3_1", "auto", "text", "", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>@@function<｜tool▁sep｜>get_time{}"),
    ("deepseek_v3", "auto_single", "text", "", deepseek_r1_block(R1_W)[:-len(DS_END)] + "@@\n" + R1_T),
]


@pytest.mark.parametrize("kind,mode,rf,prefill,text", ROWS, ids=[f"{r[0]}-{r[1]}-{i}" for i, r in enumerate(ROWS)])
def test_accepts(qwen25, kind, mode, rf, prefill, text):
    kind, _, variant = kind.partition(":")
    spec = chat_format_make(kind, variant=variant)
    request = make_request(mode, rf, tools=kind != "plain")
    expected = text.encode().find(b"@@")
    text = text.replace("@@", "")
    ok, at = qwen25.engine.accepts(spec, request, prefill, text)
    if expected < 0:
        assert (ok, at) == (True, len(text.encode()))
    else:
        assert (ok, at) == (False, expected)


def test_deepseek_markers_never_in_strings(qwen25):
    """DeepSeek's markers all start with `<｜`, which JSON strings exclude; the grammar fails inside
    the (3-byte) fullwidth bar, so the failure byte is checked as a range."""
    spec = chat_format_make("deepseek_v3", variant="v3_1")
    head = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "a<'
    ok, at = qwen25.engine.accepts(spec, make_request("auto"), "", head + '｜end▁of▁sentence｜>"}')
    assert not ok and len(head.encode()) <= at < len(head.encode()) + len("｜".encode())


# -- the chat library's golden transcripts ----------------------------------------------------------

# Golden transcripts the grammar cannot express, and why (every other non-`cut_*` one must be accepted).
GOLDEN_SKIPS = {
    # The grammar writes arguments as a JSON object; a JSON string holding JSON is a parser leniency.
    "hermes_json:string_encoded_arguments": "arguments encoded as a JSON string",
    # A commentary preamble message before the call: the harmony grammar (like xgrammar's builtin
    # harmony style) allows only analysis messages before the final message or the call.
    "harmony:preamble_then_call": "commentary preamble before a call",
    # Llama 3: a turn that opens with `{` is a call in the grammar (JSON content needs a JSON response_format).
    "llama3_json:single:json_content_is_not_a_call": "free text opening with '{'",
    "llama3_json:single:typed_call": 'the optional "type": "function" key',
    "llama3_json:single:builtin_code_call_is_text": "a built-in <|python_tag|> code call",
    "llama3_json:semicolon:semicolon_then_text": "text after the calls",
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
