"""The call syntaxes of llama3_json, mistral and deepseek_v3: values, the prefix property, errors.

Expected arguments are the generated values themselves (compared through json.loads), never our output.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxchat.chat.args_core import ArgumentSyntaxError, ParsedCall
from jaxchat.chat.args_json_calls import parse_deepseek_calls, parse_llama_call, parse_mistral_call

ARGS = {"city": "Zürich \"quoted\" \\ 🌤", "days": 3, "hourly": True, "nested": {"tags": ["a", "b c"], "x": None}}


def _llama(name, args, key="parameters"):
    return '{"name": ' + json.dumps(name) + f', "{key}": ' + json.dumps(args, ensure_ascii=False) + "}"


def _r1(name, args):
    return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{json.dumps(args)}\n```<｜tool▁call▁end｜>"


def _v31(name, args):
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{json.dumps(args)}<｜tool▁call▁end｜>"


def _calls(result) -> list[ParsedCall]:
    """Every reader's result as a list of calls (the llama reader returns one call, mistral a pair)."""
    if isinstance(result, ParsedCall):
        return [result]
    return result[0] if isinstance(result, tuple) else result


def _check_prefix_stable(parse, body: str) -> list[ParsedCall]:
    final = _calls(parse(body, False))
    previous: list[ParsedCall] = []
    for cut in range(len(body) + 1):
        current = [c for c in _calls(parse(body[:cut], True)) if c.name is not None]
        assert len(current) >= len(previous) and len(current) <= len(final), body[:cut]
        for before, after in zip(previous, current):
            assert after.name == before.name and after.arguments.startswith(before.arguments), body[:cut]
        for now, last in zip(current, final):
            assert now.name == last.name and last.arguments.startswith(now.arguments), body[:cut]
        previous = current
    return final


@pytest.mark.parametrize("parse, body, expected", [
    (parse_llama_call, _llama("get_weather", ARGS), [("get_weather", ARGS)]),
    (parse_llama_call, _llama("get_time", {}, "arguments"), [("get_time", {})]),
    (parse_llama_call, '{"type": "function", "name": "f", "parameters": {"a": 1}}', [("f", {"a": 1})]),
    (parse_llama_call, '{ "name" : "f" ,\n "parameters" : { } }', [("f", {})]),
    (parse_mistral_call, "get_weather[ARGS]" + json.dumps(ARGS), [("get_weather", ARGS)]),
    (parse_mistral_call, "get-time.v2[CALL_ID]abc123XYZ[ARGS]{}", [("get-time.v2", {})]),
    (parse_mistral_call, '[{"name": "f", "arguments": {"a": 1}, "id": "abcdefghi"}, {"arguments": {}, "name": "g"}]',
     [("f", {"a": 1}), ("g", {})]),
    (parse_mistral_call, " []", []),
    (parse_deepseek_calls, _r1("get_weather", ARGS) + "\n" + _r1("get_time", {}), [("get_weather", ARGS), ("get_time", {})]),
    (parse_deepseek_calls, _v31("get_weather", ARGS) + _v31("get_time", {}), [("get_weather", ARGS), ("get_time", {})]),
    (parse_deepseek_calls, "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```\n{}\n```<｜tool▁call▁end｜>", [("f", {})]),
])
def test_examples_at_every_split(parse, body, expected):
    calls = _check_prefix_stable(parse, body)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == expected
    assert all(c.complete for c in calls)


def test_llama_name_waits_for_the_parameters_key():
    assert parse_llama_call('{"name": "get_weather", ', True).name is None
    assert parse_llama_call('{"name": "get_weather", "parameters"', True).name is None
    body = '{"name": "get_weather", "parameters": '
    assert parse_llama_call(body, True) == ParsedCall("get_weather", "", False, len(body))


def test_ends_are_where_the_syntax_closes():
    body = _llama("f", {"a": 1})
    assert parse_llama_call(body + "; more", False).end == len(body)
    assert parse_mistral_call('f[ARGS]{"a": [1, 2]} text', False)[1] == len('f[ARGS]{"a": [1, 2]}')
    assert parse_mistral_call('[{"name": "f", "arguments": {}}]</s>', True)[1] == len('[{"name": "f", "arguments": {}}]')
    assert parse_mistral_call('f[ARGS]{"a": 1', True)[1] is None


def test_scalars_are_held_and_strings_stream():
    assert parse_mistral_call('f[ARGS]{"days": 12', True)[0][0].arguments == '{"days": '
    assert parse_mistral_call('f[ARGS]{"city": "Pa', True)[0][0].arguments == '{"city": "Pa'
    assert parse_deepseek_calls('<｜tool▁call▁begin｜>f<｜tool▁sep｜>{"a": tru', True)[0].arguments == '{"a": '


def test_partial_markers_wait():
    assert parse_mistral_call("f[CALL_I", True) == ([], None)
    assert parse_mistral_call("f[CALL_ID]abc[AR", True) == ([], None)
    assert parse_deepseek_calls("<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```js", True) == []
    assert parse_deepseek_calls("<｜tool▁call▁beg", True) == []
    assert parse_deepseek_calls(_v31("f", {}) + "<｜tool▁ca", True)[0].complete


@pytest.mark.parametrize("parse, body", [
    (parse_llama_call, '{"answer": 42}'),  # JSON content, not a call
    (parse_llama_call, '{"name": "f", "description": "x"}'),
    (parse_llama_call, '{"type": "code", "name": "f", "parameters": {}}'),
    (parse_llama_call, 'brave_search.call(query="x")'),  # Llama's built-in code calls
    (parse_llama_call, '{"name": "f", "parameters": [1]}'),
    (parse_mistral_call, "f(a=1)"),
    (parse_mistral_call, 'f[ARGS]"text"'),
    (parse_mistral_call, '[{"arguments": {}}]'),
    (parse_deepseek_calls, "text<｜tool▁call▁begin｜>"),
    (parse_deepseek_calls, "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{}<｜tool▁call▁end｜>"),
])
def test_not_the_syntax(parse, body):
    with pytest.raises(ArgumentSyntaxError):
        parse(body, True)


def test_incomplete_final_text_is_an_error():
    for parse, body in ((parse_deepseek_calls, '<｜tool▁call▁begin｜>f<｜tool▁sep｜>{"a": 1}'),
                        (parse_llama_call, '{"name": "f", "parameters": {"a": 1}'),
                        (parse_mistral_call, 'f[ARGS]{"a": 1')):
        with pytest.raises(ArgumentSyntaxError):
            parse(body, False)


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_OBJECTS = st.dictionaries(st.text(max_size=6), _VALUES, max_size=4)
_NAMES = st.from_regex(r"[a-z_][a-z0-9_.\-]{0,10}", fullmatch=True)


@settings(max_examples=40, deadline=None)
@given(name=_NAMES, args=_OBJECTS, other=_OBJECTS)
def test_property_every_syntax(name, args, other):
    bodies = [
        (parse_llama_call, _llama(name, args), [(name, args)]),
        (parse_mistral_call, f"{name}[ARGS]{json.dumps(args)}", [(name, args)]),
        (parse_mistral_call, json.dumps([{"name": name, "arguments": args}, {"name": "g", "arguments": other}]),
         [(name, args), ("g", other)]),
        (parse_deepseek_calls, _r1(name, args) + "\n" + _v31("g", other), [(name, args), ("g", other)]),
    ]
    for parse, body, expected in bodies:
        calls = _check_prefix_stable(parse, body)
        assert [(c.name, json.loads(c.arguments)) for c in calls] == expected
