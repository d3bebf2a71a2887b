"""Call envelopes (`chat.envelopes`): golden transcripts of fenced and bare JSON calls parse right, at
every split point, streamed and not, for every JSON-call kind; without the option nothing changes.

Streamed means `ChatStream`, character by character and in random chunks (hypothesis): the deltas add
up to the one-shot parse. A text cut inside an envelope follows the cut-call rule: an undecided
opening is held back while partial and is content once final; a decided call streams, and a final
text cut inside it keeps its raw text as content.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxchat.chat import ChatMsg, ChatParseOptions, ChatStream, apply_deltas, chat_format_make, chat_parse
from jaxchat.chat.envelopes import EnvelopeScanner, read_envelope
from tests.chat.golden import GOLDEN, TOOLS, Golden
from tests.chat.golden_envelopes import ENVELOPE_GOLDEN, REAL_FENCED, SPECS, compact, fence

OPTIONS = ChatParseOptions(tools=TOOLS, call_envelopes=True)
NAMES = frozenset(t["function"]["name"] for t in TOOLS)


def _calls(msg: ChatMsg) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in msg.tool_calls]


def _check(golden: Golden, msg: ChatMsg) -> None:
    assert msg.reasoning_content == golden.reasoning
    assert msg.content == golden.content
    assert _calls(msg) == list(golden.calls)


def test_every_json_call_kind_has_golden_envelopes():
    kinds = {(s.kind, s.variant) for s in SPECS}
    assert kinds == {(k, v) for k, v in {(g.spec.kind, g.spec.variant) for g in ENVELOPE_GOLDEN}}
    assert all(s.envelopes == ("fenced", "bare") for s in SPECS)
    assert not chat_format_make("mistral").envelopes and not chat_format_make("qwen_xml").envelopes


@pytest.mark.parametrize("golden", ENVELOPE_GOLDEN, ids=lambda g: g.id)
def test_envelope_golden(golden: Golden):
    _check(golden, chat_parse(golden.spec, golden.text, False, OPTIONS))


def _assert_prefix(prev: ChatMsg, cur: ChatMsg, where: str, calls: bool = True) -> None:
    assert cur.reasoning_content.startswith(prev.reasoning_content), where
    assert cur.content.startswith(prev.content), where
    if calls:
        assert len(cur.tool_calls) >= len(prev.tool_calls), where
        for before, after in zip(prev.tool_calls, cur.tool_calls):
            assert before.name == after.name and after.arguments.startswith(before.arguments), where


@pytest.mark.parametrize("golden", ENVELOPE_GOLDEN, ids=lambda g: g.id)
def test_prefix_property_at_every_split(golden: Golden):
    text = golden.text
    final = chat_parse(golden.spec, text, False, OPTIONS)
    prev = chat_parse(golden.spec, text[: len(golden.prefill)], True, OPTIONS)
    for cut in range(len(golden.prefill) + 1, len(text) + 1):
        cur = chat_parse(golden.spec, text[:cut], True, OPTIONS)
        _assert_prefix(prev, cur, f"split {cut - 1} -> {cut}: {text[:cut]!r}")
        _assert_prefix(cur, final, f"split {cut} vs final", calls=golden.cut != "call")
        prev = cur


def _stream(golden: Golden, bounds: list[int]) -> ChatMsg:
    stream = ChatStream(golden.spec, OPTIONS)
    received = ChatMsg()
    for a, b in zip(bounds, bounds[1:]):
        received = apply_deltas(received, stream.update(golden.text[a:b], False))
    return apply_deltas(received, stream.update("", True))


def _assert_same(golden: Golden, received: ChatMsg) -> None:
    final = chat_parse(golden.spec, golden.text, False, OPTIONS)
    assert (received.reasoning_content, received.content) == (final.reasoning_content, final.content)
    if golden.cut != "call":  # a streamed partial call cannot be retracted (as for native calls)
        assert [(c.name, c.arguments) for c in received.tool_calls] == [(c.name, c.arguments) for c in final.tool_calls]


@pytest.mark.parametrize("golden", ENVELOPE_GOLDEN, ids=lambda g: g.id)
def test_stream_character_by_character_equals_one_shot(golden: Golden):
    _assert_same(golden, _stream(golden, list(range(len(golden.text) + 1))))


@pytest.mark.parametrize("golden", ENVELOPE_GOLDEN, ids=lambda g: g.id)
@settings(max_examples=20, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=30))
def test_chunked_stream_equals_one_shot(golden: Golden, cuts: list[int]):
    text = golden.text
    _assert_same(golden, _stream(golden, sorted({c % (len(text) + 1) for c in cuts} | {0, len(text)})))


def test_decided_call_streams_like_a_native_one():
    spec = SPECS[0]
    text = fence(compact("get_weather", {"city": "Paris"}))
    stream = ChatStream(spec, OPTIONS)
    firsts, pieces = [], []
    for ch in text:
        for delta in stream.update(ch, False):
            if delta.tool_call_id is not None:
                firsts.append((delta.tool_call_id, delta.tool_call_name, text[: text.index(ch)]))
            pieces.append(delta.tool_call_arguments)
            assert not delta.content
    stream.update("", True)
    assert [(name) for _, name, _ in firsts] == ["get_weather"] and firsts[0][0].startswith("call_")
    assert "".join(pieces) == '{"city": "Paris"}' and len([p for p in pieces if p]) > 3  # streamed in pieces


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_cut_envelopes_while_partial(spec):
    undecided = 'Sure.\n```json\n{\n  "name": "get_wea'
    assert chat_parse(spec, undecided, True, OPTIONS).content == "Sure."
    msg = chat_parse(spec, '```json\n{"name": "get_weather", "arguments": {"city": "Pa', True, OPTIONS)
    assert (msg.content, [(c.name, c.arguments) for c in msg.tool_calls]) == ("", [("get_weather", '{"city": "Pa')])


@pytest.mark.parametrize("golden", [g for g in ENVELOPE_GOLDEN if g.spec is SPECS[0]], ids=lambda g: g.id)
def test_without_the_option_envelopes_are_content(golden: Golden):
    """The option off (tool_choice none, a JSON response_format, or a direct `chat_parse`): text as before."""
    for options in (ChatParseOptions(tools=TOOLS), ChatParseOptions(tools=TOOLS, call_envelopes=True, parse_tool_calls=False),
                    ChatParseOptions(call_envelopes=True)):
        msg = chat_parse(golden.spec, golden.text, False, options)
        assert msg.tool_calls == [] and msg.content == golden.generated.strip()


@pytest.mark.parametrize("golden", [g for g in GOLDEN if g.spec.envelopes], ids=lambda g: g.id)
def test_native_goldens_parse_the_same_with_envelopes_on(golden: Golden):
    """A model writing its native syntax reads the same whether envelopes are read or not."""
    off = chat_parse(golden.spec, golden.text, False, ChatParseOptions(tools=TOOLS))
    on = chat_parse(golden.spec, golden.text, False, OPTIONS)
    assert (on.reasoning_content, on.content, _calls(on)) == (off.reasoning_content, off.content, _calls(off))


@pytest.mark.parametrize(("tool", "text", "args"), REAL_FENCED, ids=["compact", "pretty", "array_value"])
def test_real_fenced_replies_are_calls(tool, text, args):
    msg = chat_parse(SPECS[0], text + "<|im_end|>", False, ChatParseOptions(tools=(tool,), call_envelopes=True))
    assert msg.content == "" and _calls(msg) == [(tool["function"]["name"], args)]


# -- the reader and the scanner ---------------------------------------------------------------------
@pytest.mark.parametrize(("body", "partial", "calls", "end", "rejected"), [
    ("`", True, [], None, False),
    ("``x", True, [], None, True),
    ("```python\n", True, [], None, False),
    ("```python\nx = 1", True, [], None, True),
    ('{"name": "get_t', True, [], None, False),
    ('{"name": "got', True, [], None, True),
    ('{"name": "get_time", "arguments": {}}', True, [("get_time", "{}", True)], 37, False),
    ('{"name": "get_time", "arguments": {', True, [("get_time", "{", False)], None, False),
    ('{"name": "get_time", "arguments": {', False, [], None, True),
    ('[{"name": "get_time", "arguments": {}}, {"name": "get_', True, [("get_time", "{}", True)], None, False),
    ('[{"name": "get_time", "arguments": {}}, {"name": "get_', False, [("get_time", "{}", True)], 38, False),
    ('[{"name": "get_time", "arguments": {}}, {"x": 1}]', True, [("get_time", "{}", True)], 38, False),
    ('```json\n{"name": "get_time", "arguments": {}}\n``', True, [("get_time", "{}", True)], None, False),
    ('```json\n{"name": "get_time", "arguments": {}}\n```\nok', True, [("get_time", "{}", True)], 49, False),
    ('```json\n{"name": "get_time", "arguments": {}}\nok', True, [("get_time", "{}", True)], 45, False),
])
def test_read_envelope(body, partial, calls, end, rejected):
    read = read_envelope(body, NAMES, partial)
    assert [(c.name, c.arguments, c.complete) for c in read.calls] == calls
    assert (read.end, read.rejected) == (end, rejected)


def test_scanner_finds_line_starts_only():
    scanner = EnvelopeScanner(SPECS[0], OPTIONS)
    text = 'a {x}\n  b [y]\n\t`z'
    assert scanner.find(text, 0, len(text)) == text.index("`")
    scanner.reset(0)
    assert scanner.find("[a", 0, 2) == 0 and scanner.find("x\n  ", 0, 4) == -1
    assert not EnvelopeScanner(SPECS[0], ChatParseOptions(tools=TOOLS)).on
