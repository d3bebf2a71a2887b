"""The per-request constraint: give_up, the reasoning switch, token bans, mask layout, tag rules."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from jaxchat.chat import RequestError, chat_format_make
from jaxchat.constrain import chat_make_constraint, chat_structural_tag
from tests.constrain.support import _bit, make_request


def test_give_up_logs_once_and_stops_masking(qwen25, caplog):
    spec = chat_format_make("hermes_json")
    c = qwen25.engine.make(spec, make_request("required"), "")
    row = np.zeros(qwen25.engine.vocab_size // 32 + 1, dtype=np.int32)
    c.fill_mask(row)
    assert not _bit(row, qwen25.encode("Hello")[0])
    c.inject_rejection()
    with caplog.at_level(logging.WARNING, logger="jaxchat"):
        assert c.accept(qwen25.encode("Hello")[0]) is False
        assert c.accept(qwen25.encode(" world")[0]) is True
    assert [r.getMessage() for r in caplog.records].count(
        "Constrained decoding disabled for this request: token 9707 rejected (injected by a test)") <= 1
    assert sum("Constrained decoding disabled" in r.getMessage() for r in caplog.records) == 1
    c.fill_mask(row)
    assert (row == -1).all() and not c.is_terminated()


def test_real_rejection_gives_up(qwen25):
    c = qwen25.engine.make(chat_format_make("hermes_json"), make_request("required"), "")
    assert c.accept(qwen25.encode("Hello")[0]) is False and c.disabled


def test_reasoning_switch_on_prefill(vocab):
    v = vocab("qwen3")
    spec = chat_format_make("hermes_json", reasoning=True)
    request = make_request("required", reasoning=False)
    assert "optional" not in str(chat_structural_tag(spec, request))
    c = v.engine.make(spec, request, "<think>")
    assert c.switched and not c.disabled
    for t in v.encode("\nplan</think>\n\n" + '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'):
        assert c.accept(t)
    assert c.matcher.is_completed()


def test_reasoning_switch_on_forced_token(vocab):
    v = vocab("qwen3")
    spec = chat_format_make("hermes_json", reasoning=True)
    c = v.engine.make(spec, make_request("required", reasoning=False), "")
    assert c.accept_forced(v.encode("<think>")[0]) and c.switched and not c.disabled


def test_token_ban_for_tool_choice_none(qwen25):
    spec = chat_format_make("hermes_json")
    c = chat_make_constraint(qwen25.engine, spec, make_request("none"))
    opener = qwen25.engine.token_id("<tool_call>")
    row = np.zeros(qwen25.engine.vocab_size // 32 + 1, dtype=np.int32)
    c.fill_mask(row)
    assert not _bit(row, opener) and _bit(row, opener - 1) and _bit(row, 0)
    assert c.accept(opener) is False and c.accept(0)


def test_nothing_to_constrain():
    assert chat_structural_tag(chat_format_make("hermes_json"), make_request("none")) is None
    assert chat_structural_tag(chat_format_make("plain"), make_request("auto")) is None


def test_tools_disabled_and_plain():
    with pytest.raises(RequestError):
        chat_structural_tag(chat_format_make("hermes_json"), make_request("required"), tools_enabled=False)
    with pytest.raises(RequestError):
        chat_structural_tag(chat_format_make("plain"), make_request("named"))
    assert chat_structural_tag(chat_format_make("hermes_json"), make_request("auto"), tools_enabled=False) is None


def test_compiled_grammar_cache_is_bounded_lru(vocabs):
    engine = vocabs["qwen25"]().engine
    size = engine.cache_size
    engine.cache_size = 2
    try:
        tags = [{"type": "structural_tag", "format": {"type": "const_string", "value": f"v{i}"}} for i in range(3)]
        first = engine.compile(tags[0])
        engine.compile(tags[1])
        assert engine.compile(tags[0]) is first  # a hit moves it to the back
        engine.compile(tags[2])  # evicts tags[1], the least recently used
        keys = list(engine._cache)
        assert len(keys) == 2 and '"v1"' not in "".join(keys) and engine.compile(tags[0]) is first
    finally:
        engine.cache_size = size


def test_batched_fill_equals_one_by_one(qwen25):
    """`GrammarConstraint.fill_masks` (one batched xgrammar call) writes, row for row, what `fill_mask` writes:
    constraints in different states (fresh, inside a call's arguments, given up, a json_schema) and the marker
    guard included."""
    from jaxchat.constrain.constraint import GrammarConstraint

    spec = chat_format_make("hermes_json")
    engine = qwen25.engine
    made = [engine.make(spec, make_request(mode), "") for mode in ("auto", "required", "required", "auto")]
    made.append(engine.make(spec, make_request("auto", response_format="json_schema", tools=False), ""))
    for t in qwen25.encode('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'):
        assert made[2].accept(t)
    made[3].inject_rejection()
    made[3].accept(qwen25.encode("Hi")[0])  # given up: all ones
    words = engine.vocab_size // 32 + 1
    one_by_one = np.zeros((len(made), words), np.int32)
    for c, row in zip(made, one_by_one, strict=True):
        c.fill_mask(row)
    together = np.full((len(made), words), 7, np.int32)
    GrammarConstraint.fill_masks(made, list(together))
    assert np.array_equal(together, one_by_one)
    assert len({row.tobytes() for row in one_by_one}) == len(made)  # every state a different mask
