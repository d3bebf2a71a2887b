"""Golden transcripts of every format parse to the expected message, and the prefix property holds.

The prefix property is checked at every split point of every transcript (each partial parse is a
prefix of the next one and of the final parse), and randomly chunked streams (hypothesis) must
deliver deltas that add up to exactly the one-shot parse.
"""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxchat.chat import ChatMsg, ChatParseOptions, ChatStream, apply_deltas, chat_parse
from tests.chat.golden import GOLDEN, HERMES, TOOLS, Golden

OPTIONS = ChatParseOptions(parse_tool_calls=True, tools=TOOLS)


def _check_expected(golden: Golden, msg: ChatMsg) -> None:
    assert msg.reasoning_content == golden.reasoning
    assert msg.content == golden.content
    assert [c.name for c in msg.tool_calls] == [name for name, _ in golden.calls]
    for call, (_, args) in zip(msg.tool_calls, golden.calls):
        assert json.loads(call.arguments) == args


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda g: g.id)
def test_golden_transcript(golden: Golden):
    _check_expected(golden, chat_parse(golden.spec, golden.text, False, OPTIONS))


@pytest.mark.parametrize("golden", [g for g in GOLDEN if g.name == "arguments_out_of_order"], ids=lambda g: g.id)
def test_arguments_keep_the_written_order(golden: Golden):
    """Arguments come out in the order the model wrote them, whatever order the schema declares."""
    msg = chat_parse(golden.spec, golden.text, False, OPTIONS)
    assert [list(json.loads(c.arguments)) for c in msg.tool_calls] == [list(args) for _, args in golden.calls]


def _assert_prefix(prev: ChatMsg, cur: ChatMsg, where: str, calls: bool = True) -> None:
    assert cur.reasoning_content.startswith(prev.reasoning_content), where
    assert cur.content.startswith(prev.content), where
    if not calls:
        return
    assert len(cur.tool_calls) >= len(prev.tool_calls), where
    for before, after in zip(prev.tool_calls, cur.tool_calls):
        assert before.name == after.name, where
        assert after.arguments.startswith(before.arguments), where


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda g: g.id)
def test_prefix_property_at_every_split(golden: Golden):
    text = golden.text
    final = chat_parse(golden.spec, text, False, OPTIONS)
    start = len(golden.prefill)
    prev = chat_parse(golden.spec, text[:start], True, OPTIONS)
    for cut in range(start + 1, len(text) + 1):
        cur = chat_parse(golden.spec, text[:cut], True, OPTIONS)
        _assert_prefix(prev, cur, f"split {cut - 1} -> {cut}: {text[:cut]!r}")
        # A final text cut inside a call drops that call: only its text fields stay prefixes.
        _assert_prefix(cur, final, f"split {cut} vs final", calls=golden.cut != "call")
        prev = cur


def _stream(golden: Golden, cuts: list[int]) -> ChatMsg:
    stream = ChatStream(golden.spec, OPTIONS)
    text = golden.text
    bounds = sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})
    received = ChatMsg()
    for a, b in zip(bounds, bounds[1:]):
        received = apply_deltas(received, stream.update(text[a:b], False))
    return apply_deltas(received, stream.update("", True))


@pytest.mark.parametrize("golden", GOLDEN, ids=lambda g: g.id)
@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=40))
def test_chunked_stream_equals_one_shot(golden: Golden, cuts: list[int]):
    final = chat_parse(golden.spec, golden.text, False, OPTIONS)
    received = _stream(golden, cuts)
    assert received.reasoning_content == final.reasoning_content
    assert received.content == final.content
    if golden.cut == "call":
        return  # the streamed partial call cannot be retracted; test_cut_call_stream covers it
    assert [(c.name, c.arguments) for c in received.tool_calls] == [(c.name, c.arguments) for c in final.tool_calls]


def test_stream_token_by_token_ids_are_stable():
    golden = next(g for g in GOLDEN if g.spec is HERMES and g.name == "parallel_calls")
    stream = ChatStream(golden.spec, OPTIONS)
    firsts = []
    for ch in golden.text:
        for delta in stream.update(ch, False):
            if delta.tool_call_id is not None:
                firsts.append((delta.tool_call_index, delta.tool_call_id, delta.tool_call_name))
    stream.update("", True)
    assert [(i, n) for i, _, n in firsts] == [(0, "get_weather"), (1, "get_time")]
    for _, call_id, _ in firsts:
        assert call_id.startswith("call_") and len(call_id) == 5 + 24 and call_id[5:].isalnum()
    assert [c.id for c in stream.parsed.tool_calls] == [i for _, i, _ in firsts]


def test_cut_call_stream_logs_rewrite_and_keeps_raw_text(caplog):
    golden = next(g for g in GOLDEN if g.spec is HERMES and g.name == "cut_in_call")
    stream = ChatStream(golden.spec, OPTIONS)
    received = ChatMsg()
    for ch in golden.text:
        received = apply_deltas(received, stream.update(ch, False))
    assert [c.name for c in received.tool_calls] == ["get_weather"]
    with caplog.at_level(logging.WARNING, logger="jaxchat"):
        received = apply_deltas(received, stream.update("", True))
    assert "chat parser rewrote already streamed tool calls" in caplog.text
    assert received.content == golden.content  # the raw call text reached the client as content


def test_no_tools_keeps_markup_in_content():
    golden = next(g for g in GOLDEN if g.spec is HERMES and g.name == "reasoning_one_call")
    msg = chat_parse(golden.spec, golden.text, False, ChatParseOptions(parse_tool_calls=False))
    assert msg.tool_calls == []
    assert msg.reasoning_content == "Need the weather."
    assert msg.content.startswith("<tool_call>") and msg.content.endswith("</tool_call>")


def test_partial_marker_is_held_back():
    assert chat_parse(HERMES, "Hello <tool_ca", True, OPTIONS).content == "Hello"
    assert chat_parse(HERMES, "Hello <tool_ca", False, OPTIONS).content == "Hello <tool_ca"
    assert chat_parse(HERMES, "Hello <toolbox>", True, OPTIONS).content == "Hello <toolbox>"
    assert chat_parse(HERMES, "Hi<|im_e", True, OPTIONS).content == "Hi"


def test_scalars_are_held_until_they_end():
    partial = chat_parse(HERMES, '<tool_call>{"name": "get_weather", "arguments": {"days": 12', True, OPTIONS)
    assert partial.tool_calls[0].arguments == '{"days": '
    partial = chat_parse(HERMES, '<tool_call>{"name": "get_weather", "arguments": {"city": "Pa', True, OPTIONS)
    assert partial.tool_calls[0].arguments == '{"city": "Pa'


def test_malformed_block_stays_content():
    msg = chat_parse(HERMES, "<tool_call>not json</tool_call> ok", False, OPTIONS)
    assert msg.tool_calls == []
    assert msg.content == "<tool_call>not json</tool_call>\n\nok"
