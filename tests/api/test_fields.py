"""The table of decoding fields (`jaxchat.api.fields.FIELDS`) walked field by field, no model: docs/api.md prints it,
each refused field and each non-neutral value is a 400 naming the field, each neutral value and each no-effect
field is accepted, each alias reads as its field, each honoured field is read into the request. (That the
honoured sampling fields change the output is `tests/e2e/test_structured_output.py`'s.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from jaxchat.api import parse_chat_request, parse_completion_request
from jaxchat.api.fields import FIELDS
from jaxchat.chat import RequestError

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
MSGS = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


def _parsers(name: str):
    yield lambda extra: parse_chat_request({"messages": MSGS, **extra})
    if name not in ("tools", "tool_choice", "parallel_tool_calls", "reasoning_effort", "chat_template_kwargs",
                    "logprobs", "top_logprobs"):  # chat only (a completion's logprobs is a count)
        yield lambda extra: parse_completion_request({"prompt": "x", **extra})


def test_docs_print_the_table():
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"\| `([a-z_]+)` \| ([^|]+) \| ([a-z ]+) \| ([^|]*) \|$", line)
        if m:
            rows[m.group(1)] = (m.group(2).strip(), m.group(3).strip())
    assert rows == {f.name: (f.origin, f.status) for f in FIELDS}


def _off_value(neutral: tuple):
    """A value that is not neutral."""
    first = neutral[0]
    if isinstance(first, bool):
        return not first
    if isinstance(first, (int, float)):
        return 7
    return ["zzz"]


@pytest.mark.parametrize("field", [f for f in FIELDS if f.status in ("refused", "neutral only")], ids=lambda f: f.name)
def test_refused_and_non_neutral_values_are_400s(field):
    values = [_off_value(field.neutral)] if field.status == "neutral only" else [1, "x", {"a": 1}, True]
    for parse in _parsers(field.name):
        for value in values:
            try:
                parse({field.name: value})
            except RequestError as err:
                assert err.param == field.name, (field.name, value, err.param, err.message)
                continue
            assert field.name == "echo", f"{field.name}={json.dumps(value)} was accepted"  # completions honour echo


@pytest.mark.parametrize("field", [f for f in FIELDS if f.status == "neutral only"], ids=lambda f: f.name)
def test_neutral_values_are_accepted(field):
    for parse in _parsers(field.name):
        for value in field.neutral:
            parse({field.name: value})


def test_best_of_equal_to_n_is_accepted():
    parse_completion_request({"prompt": "x", "n": 3, "best_of": 3})
    with pytest.raises(RequestError) as err:
        parse_completion_request({"prompt": "x", "n": 2, "best_of": 3})
    assert err.value.param == "best_of"


@pytest.mark.parametrize("field", [f for f in FIELDS if f.status == "no effect"], ids=lambda f: f.name)
def test_no_effect_fields_are_accepted(field):
    for parse in _parsers(field.name):
        parse({field.name: "anything" if field.name != "store" else True})


def test_aliases_read_as_their_fields():
    assert parse_completion_request({"prompt": "x", "repeat_penalty": 1.3}).sampling.repetition_penalty == 1.3
    assert parse_completion_request({"prompt": "x", "n_predict": 7}).sampling.max_tokens == 7
    assert parse_chat_request({"messages": MSGS, "n_predict": -1}).sampling.max_tokens is None
    for extra, param in (({"repeat_penalty": 1.1, "repetition_penalty": 1.2}, "repeat_penalty"),
                         ({"n_predict": 5, "max_tokens": 5}, "n_predict"), ({"n_predict": 0}, "n_predict"),
                         ({"repeat_penalty": 0}, "repeat_penalty")):
        with pytest.raises(RequestError) as err:
            parse_completion_request({"prompt": "x", **extra})
        assert err.value.param == param
    assert {f.alias_of for f in FIELDS if f.status == "alias"} == {"repetition_penalty", "max_tokens"}


# honoured field -> (value, where the parsed request holds it)
HONOURED = {
    "max_tokens": (9, lambda r: r.sampling.max_tokens == 9),
    "max_completion_tokens": (9, lambda r: r.sampling.max_tokens == 9),
    "temperature": (0.5, lambda r: r.sampling.temperature == 0.5),
    "top_p": (0.5, lambda r: r.sampling.top_p == 0.5),
    "n": (3, lambda r: r.n == 3),
    "seed": (5, lambda r: r.sampling.seed == 5),
    "stop": (["z"], lambda r: r.sampling.stop == ("z",)),
    "presence_penalty": (0.5, lambda r: r.sampling.presence_penalty == 0.5),
    "frequency_penalty": (0.5, lambda r: r.sampling.frequency_penalty == 0.5),
    "logit_bias": ({"5": 3}, lambda r: r.sampling.logit_bias == ((5, 3.0),)),
    "logprobs": (True, lambda r: r.sampling.logprobs == 0),
    "top_logprobs": (2, None),
    "response_format": ({"type": "json_object"}, lambda r: r.constraint.response_format == "json_object"
                        if hasattr(r, "constraint") else r.output.kind == "json"),
    "tools": (TOOLS, lambda r: r.constraint.tools[0]["function"]["name"] == "f"),
    "tool_choice": ("required", None),
    "parallel_tool_calls": (False, None),
    "reasoning_effort": ("low", lambda r: r.constraint.reasoning_effort == "low"),
    "top_k": (4, lambda r: r.sampling.top_k == 4),
    "min_p": (0.2, lambda r: r.sampling.min_p == 0.2),
    "repetition_penalty": (1.2, lambda r: r.sampling.repetition_penalty == 1.2),
    "stop_token_ids": ([3], lambda r: r.sampling.stop_token_ids == (3,)),
    "ignore_eos": (True, lambda r: r.sampling.ignore_eos),
    "chat_template_kwargs": ({"x": 1}, lambda r: r.constraint.chat_template_kwargs == {"x": 1}),
    "structured_outputs": ({"regex": "a"}, None),
    "guided_regex": ("a", None),
    "guided_choice": (["a"], None),
    "guided_grammar": ('root ::= "a"', None),
    "guided_json": ({"type": "object"}, None),
    "regex": ("a", None),
    "ebnf": ('root ::= "a"', None),
    "json_schema": ({"type": "object"}, None),
    "grammar": ('root ::= "a"', None),
}


def _output(request):
    return request.constraint.output if hasattr(request, "constraint") else request.output


@pytest.mark.parametrize("field", [f for f in FIELDS if f.status == "honoured"], ids=lambda f: f.name)
def test_honoured_fields_are_read(field):
    value, held = HONOURED[field.name]
    extra = {field.name: value}
    if field.name == "top_logprobs":
        extra["logprobs"] = True
        held = lambda r: r.sampling.logprobs == 2  # noqa: E731
    if field.name in ("tool_choice", "parallel_tool_calls"):
        extra["tools"] = TOOLS
        held = lambda r: r.constraint.tool_choice == "required" if field.name == "tool_choice" \
            else r.constraint.parallel_tool_calls is False  # noqa: E731
    if held is None:  # a structured-output field
        held = lambda r: _output(r) is not None and _output(r).param.split(".")[0] == field.name  # noqa: E731
    for parse in _parsers(field.name):
        assert held(parse(extra)), field.name
