"""The service reads call envelopes as the grammar constrains them: a fenced call under tool_choice "auto"
is a tool call (streamed and not, the same), text around it is content; JSON naming no tool, tool_choice
"none" and a JSON response_format leave the text as it was; a cut envelope follows the cut-call rules.

Same scripted engine and real Qwen2.5 template as `test_service.py` (no grammar: the engine's output is
the script).
"""

from __future__ import annotations

import pytest

from tests.api.test_service import WEATHER, _both, hermes  # noqa: F401 - `hermes` is a fixture

FENCED = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'
BODY = {"messages": [{"role": "user", "content": "hello"}], "tools": [WEATHER]}


def _calls(choice: dict) -> list[dict]:
    return [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in choice["message"].get("tool_calls") or ()]


def test_a_fenced_call_under_auto_is_a_tool_call(hermes):  # noqa: F811
    engine, client = hermes
    engine.reply = ("Let me check.\n" + FENCED + "\nOne moment.", "stop", 2)
    choice, streamed = _both(client, BODY)
    assert _calls(choice) == streamed["tool_calls"] == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert choice["message"]["content"] == streamed["content"] == "Let me check.\n\nOne moment."
    assert choice["finish_reason"] == streamed["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["id"].startswith("call_")


@pytest.mark.parametrize("extra", [{"tool_choice": "none"}, {"response_format": {"type": "json_object"}}, {"tools": None}],
                         ids=["tool_choice_none", "json_response_format", "no_tools"])
def test_envelopes_are_text_where_calls_are_not_read_from_them(hermes, extra):  # noqa: F811
    engine, client = hermes
    engine.reply = (FENCED, "stop", 2)
    choice, streamed = _both(client, {**BODY, **extra})
    assert choice["message"]["content"] == streamed["content"] == FENCED
    assert not choice["message"].get("tool_calls") and choice["finish_reason"] == "stop"


def test_json_naming_no_tool_stays_content(hermes):  # noqa: F811
    engine, client = hermes
    answer = '```json\n{"name": "John", "arguments": {"age": 3}}\n```'
    engine.reply = (answer, "stop", 2)
    choice, streamed = _both(client, BODY)
    assert choice["message"]["content"] == streamed["content"] == answer and not streamed["tool_calls"]


@pytest.mark.parametrize(("text", "content", "calls"), [
    ("Sure.\n```json\n{\n  \"name\": \"get_wea", "Sure.", []),
    ("Sure.\n" + FENCED[:FENCED.index("ris")], "Sure.", [{"name": "get_weather", "arguments": '{"city": "Pa'}]),
], ids=["undecided", "decided"])
def test_a_cut_envelope_reads_as_streamed(hermes, text, content, calls):  # noqa: F811
    engine, client = hermes
    engine.reply = (text, "length", None)
    choice, streamed = _both(client, BODY)
    assert choice["message"]["content"] == streamed["content"] == content
    assert _calls(choice) == streamed["tool_calls"] == calls
    assert choice["finish_reason"] == streamed["finish_reason"] == "length"
