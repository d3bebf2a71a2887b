"""Incremental detokenisation (partial UTF-8 held back, special tokens as text) and stop strings."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from jaxchat.engine.tokenizer import IncrementalDetokenizer, StopStringMatcher
from tests.engine.helpers import byte_tokenizer

TOK = byte_tokenizer()


def _stream(ids, prompt=()):
    d = IncrementalDetokenizer(TOK, list(prompt))
    deltas = [d.add(t) for t in ids]
    return deltas, d.flush()


def test_multibyte_utf8_split_across_tokens_is_held_back():
    ids = list("é🙂".encode())  # byte tokens: id == byte value in the helper tokenizer
    deltas, tail = _stream(ids, TOK.encode("hi"))
    assert deltas == ["", "é", "", "", "", "🙂"]
    assert tail == ""
    assert all("\ufffd" not in d for d in deltas)


def test_special_tokens_reach_the_parser_as_text():
    ids = TOK.encode("hello") + [TOK.convert_tokens_to_ids("<tool_call>")] + TOK.encode(" world")
    deltas, tail = _stream(ids)
    assert "".join(deltas) + tail == "hello<tool_call> world"


def test_incomplete_sequence_is_flushed_at_the_end():
    deltas, tail = _stream(list("a🙂".encode())[:3])
    assert "".join(deltas) == "a"
    assert tail == "\ufffd"


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab hé€🙂\n")), min_size=0, max_size=20), st.text(max_size=5))
def test_deltas_concatenate_to_the_full_decode(text, prompt):
    ids = TOK.encode(text)
    deltas, tail = _stream(ids, TOK.encode(prompt))
    assert "".join(deltas) + tail == TOK.decode(ids, skip_special_tokens=False)
    assert all("\ufffd" not in d for d in deltas)


def _run_stops(pieces, stops):
    m = StopStringMatcher(stops)
    out = []
    for p in pieces:
        emit, stop = m.push(p)
        out.append(emit)
        if stop is not None:
            return "".join(out), stop
    return "".join(out) + m.flush(), None


def test_stop_strings():
    assert _run_stops(["Hel", "lo ST", "OP more"], ["STOP"]) == ("Hello ", "STOP")
    assert _run_stops(["ab", "c"], ["abd"]) == ("abc", None)
    assert _run_stops(["xx</", "tool>"], ["</tool>", "x</"]) == ("x", "x</")
    m = StopStringMatcher(["END"])
    assert m.push("foo E") == ("foo ", None)  # "E" may start "END": held back
    assert m.push("N") == ("", None)
    assert m.push("x") == ("ENx", None)
    assert StopStringMatcher([]).push("abc") == ("abc", None)


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="abc", max_size=30), st.lists(st.text(alphabet="abc", min_size=1, max_size=4), max_size=3),
       st.lists(st.integers(1, 5), min_size=1, max_size=30))
def test_stop_strings_match_the_whole_text_reference(text, stops, cuts):
    pieces, i = [], 0
    for c in cuts:
        pieces.append(text[i : i + c])
        i += c
    pieces.append(text[i:])
    got = _run_stops(pieces, stops)
    ends = [(text.find(s) + len(s), text.find(s), s) for s in stops if s in text]
    if not ends:
        assert got == (text, None)
    else:
        _, start, stop = min(ends)  # the stop string that completes first, whatever the chunking
        assert got == (text[:start], stop)
