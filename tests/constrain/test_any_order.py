"""Tool arguments in any order: every argument grammar admits the schema's top-level properties in any
order, each at most once, all required ones present, nothing else (`objects.py`, `any_order.py`).

Calls are written per dialect from (key, value) pairs; a `@@` in a key, or at the end of the argument
list (`mark_end`), marks the byte where the grammar must fail, as in `test_accepts.py`.
"""

from __future__ import annotations

import itertools
import json

import pytest
import xgrammar as xgr

from jaxchat.chat import chat_constraint_request_from_openai, chat_format_make
from jaxchat.constrain import chat_structural_tag
from jaxchat.constrain.any_order import MAX_ANY_ORDER, any_order_rules
from jaxchat.constrain.objects import any_order_arguments

FORECAST = {"type": "function", "function": {"name": "forecast", "strict": True, "parameters": {
    "type": "object",
    "properties": {
        "location": {"type": "string"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "exact": {"type": "boolean"},
    },
    "required": ["location", "days"],
    "additionalProperties": False,
}}}
VALUES = {"location": "Paris, FR", "unit": "celsius", "days": 3, "exact": True}


def _json_args(pairs, mark_end: bool) -> str:
    return "{" + ", ".join(f'"{k}": {json.dumps(v)}' for k, v in pairs) + ("@@" if mark_end else "") + "}"


def _xml_value(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _py_value(value) -> str:
    return repr(value) if isinstance(value, str | bool) else json.dumps(value)


def _gemma_value(value) -> str:
    return f'<|"|>{value}<|"|>' if isinstance(value, str) else json.dumps(value)


def _hermes(name, pairs, mark_end=False) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {_json_args(pairs, mark_end)}}}\n</tool_call>'


def _harmony(name, pairs, mark_end=False) -> str:
    return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{_json_args(pairs, mark_end)}<|call|>"


def _qwen_xml(name, pairs, mark_end=False) -> str:
    params = "".join(f"<parameter={k}>\n{_xml_value(v)}\n</parameter>\n" for k, v in pairs)
    return f"<tool_call>\n<function={name}>\n{params}{'<@@/' if mark_end else '</'}function>\n</tool_call>"


def _lfm2(name, pairs, mark_end=False) -> str:
    args = ", ".join(f"{k}={_py_value(v)}" for k, v in pairs)
    return f"<|tool_call_start|>[{name}({args}{'@@' if mark_end else ''})]<|tool_call_end|>"


def _gemma4(name, pairs, mark_end=False) -> str:
    args = ",".join(f"{k}:{_gemma_value(v)}" for k, v in pairs)
    return f"<|tool_call>call:{name}{{{args}{'@@' if mark_end else ''}}}<tool_call|>"


WRITERS = {"hermes_json": _hermes, "qwen_xml": _qwen_xml, "lfm2": _lfm2, "gemma4": _gemma4, "harmony": _harmony}
PREFILL = {"harmony": "assistant"}


def _request(tool: dict):
    return chat_constraint_request_from_openai(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [tool], "tool_choice": "required"})


def _check(engine, kind: str, tool: dict, text: str) -> None:
    """`text` is accepted whole, or rejected exactly at its `@@`."""
    expected = text.encode().find(b"@@")
    text = text.replace("@@", "")
    got = engine.accepts(chat_format_make(kind), _request(tool), PREFILL.get(kind, ""), text)
    assert got == ((True, len(text.encode())) if expected < 0 else (False, expected)), text


@pytest.mark.parametrize("kind", WRITERS)
def test_every_permutation_accepted(qwen25, kind):
    write = WRITERS[kind]
    for order in itertools.permutations(VALUES):
        _check(qwen25.engine, kind, FORECAST, write("forecast", [(k, VALUES[k]) for k in order]))
    for order in itertools.permutations(["days", "location", "exact"]):  # an optional one left out
        _check(qwen25.engine, kind, FORECAST, write("forecast", [(k, VALUES[k]) for k in order]))


@pytest.mark.parametrize("kind", WRITERS)
def test_repeated_missing_and_extra_rejected(qwen25, kind):
    write = WRITERS[kind]
    cases = [
        [("days", 3), ("location", "x"), ("@@days", 4)],  # repeated
        [("unit", "celsius"), ("location", "x"), ("@@unit", "celsius")],  # an optional one repeated
        [("exact", False), ("@@exact", True), ("days", 2), ("location", "x")],  # repeated at once
        [("location", "x"), ("@@zone", "UTC"), ("days", 2)],  # extra, under strict
    ]
    for pairs in cases:
        _check(qwen25.engine, kind, FORECAST, write("forecast", pairs))
    _check(qwen25.engine, kind, FORECAST, write("forecast", [("unit", "celsius"), ("location", "x")], mark_end=True))
    _check(qwen25.engine, kind, FORECAST, write("forecast", [("days", 1)], mark_end=True))


# -- above the bound: any order within groups of MAX_ANY_ORDER properties, groups in declared order --

WIDE_KEYS = [f"k{i}" for i in range(MAX_ANY_ORDER + 2)]
WIDE = {"type": "function", "function": {"name": "wide", "parameters": {
    "type": "object", "properties": {k: {"type": "integer"} for k in WIDE_KEYS}, "required": ["k0", WIDE_KEYS[-1]]}}}


@pytest.mark.parametrize("kind", ["hermes_json", "qwen_xml", "lfm2"])
def test_wide_schema_groups(qwen25, kind):
    write = WRITERS[kind]
    first, second = WIDE_KEYS[:MAX_ANY_ORDER], WIDE_KEYS[MAX_ANY_ORDER:]
    ok = [*reversed(first), *reversed(second)]
    _check(qwen25.engine, kind, WIDE, write("wide", [(k, 1) for k in ok]))
    _check(qwen25.engine, kind, WIDE, write("wide", [("k0", 1), (second[-1], 1)]))  # optional ones left out
    _check(qwen25.engine, kind, WIDE, write("wide", [("k0", 1), (second[0], 1), ("k@@1", 1)]))  # back to group 1
    _check(qwen25.engine, kind, WIDE, write("wide", [("k@@" + second[-1][1:], 1), ("k0", 1)]))  # k0 is required


# -- which schemas keep the declared order ----------------------------------------------------------


def _fmt(schema: dict, style: str = "json") -> dict:
    fmt = {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": 4, "excludes": ["</tool_call>", "<|"]}
    return fmt if style == "json" else {**fmt, "style": style}


TWO = {"a": {"type": "string"}, "b": {"type": "integer"}}
_BYTES = xgr.TokenizerInfo([bytes([i]).decode("latin-1") for i in range(256)], xgr.VocabType.RAW)


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"type": "string"}}},  # one property: nothing to reorder
    {"type": "object", "properties": TWO, "additionalProperties": True},
    {"type": "object", "properties": TWO, "additionalProperties": {"type": "string"}},
    {"type": "object", "properties": TWO, "minProperties": 1},
    {"type": "object", "properties": TWO, "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
    {"type": "object", "properties": TWO, "patternProperties": {"^x": {}}},
    {"type": "object", "properties": TWO, "required": ["c"]},
    {"type": "object", "properties": {**TWO, "c": {"$ref": "#/properties/a"}}},
    {"$ref": "#/$defs/o", "$defs": {"o": {"type": "object", "properties": TWO}}},
])
def test_declared_order_kept_where_any_order_would_change_the_schema(schema):
    fmt = _fmt(schema)
    assert any_order_arguments(fmt) is fmt


@pytest.mark.parametrize("style", ["json", "qwen_xml", "gemma"])
def test_eligible_schemas_become_grammars(style):
    schema = {"type": "object", "title": "t", "description": "d", "properties": {
        **TWO, "c": {"$ref": "#/$defs/c"}}, "required": ["b"], "additionalProperties": False,
        "$defs": {"c": {"type": "object", "properties": {"x": {"type": "number"}}}}}
    out = any_order_arguments(_fmt(schema, style))
    assert out["type"] == "grammar"
    xgr.Grammar.from_ebnf(out["grammar"])


def _bytes_accept(fmt: dict, text: str) -> bool:
    tag = json.dumps({"type": "structural_tag", "format": fmt})
    matcher = xgr.GrammarMatcher(xgr.GrammarCompiler(_BYTES).compile_structural_tag(tag))
    return matcher.accept_string(text.encode()) and matcher.is_completed()


def test_unusual_keys_and_values():
    """Keys that need escaping or are not identifiers, unions, and recursive `$defs` keep working."""
    schema = {"type": "object", "properties": {
        "my-key": {"type": "string"}, "with space": {"type": ["integer", "null"]}, "ünï": {"type": "boolean"},
        'a"b': {"anyOf": [{"type": "string"}, {"type": "integer"}]}, "tree": {"$ref": "#/$defs/node"}},
        "required": ["ünï"], "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}}}
    grammar = any_order_arguments(_fmt(schema))
    assert grammar["type"] == "grammar"
    assert _bytes_accept(grammar, '{"tree": {"next": {}}, "a\\"b": 3, "ünï": true, "with space": null, "my-key": "x"}')
    assert not _bytes_accept(grammar, '{"my-key": "x", "with space": 1}')  # ünï is required
    assert not _bytes_accept(grammar, '{"ünï": true, "with space": 1, "with space": 2}')


def test_a_property_xgrammar_cannot_build_keeps_the_declared_format():
    fmt = _fmt({"type": "object", "properties": {"a": False, "b": {"type": "integer"}}})
    assert any_order_arguments(fmt) is fmt


def test_additional_properties_keep_todays_declared_order(qwen25):
    tool = {"type": "function", "function": {"name": "open", "parameters": {
        "type": "object", "properties": TWO, "additionalProperties": True}}}
    _check(qwen25.engine, "hermes_json", tool, _hermes("open", [("a", "x"), ("b", 1), ("zone", "UTC")]))


def test_rule_names_in_values_stay_literal(qwen25):
    """Enum values and keys that spell xgrammar rule names are literals, not renamed references."""
    tool = {"type": "function", "function": {"name": "odd", "parameters": {"type": "object", "properties": {
        "root_0": {"enum": ["basic_string", "whitespace_1"]}, "basic_any": {"type": "string"}}, "required": ["root_0"]}}}
    for kind in ("hermes_json", "qwen_xml", "gemma4"):
        _check(qwen25.engine, kind, tool, WRITERS[kind]("odd", [("basic_any", "x"), ("root_0", "whitespace_1")]))


def test_tags_use_the_any_order_grammar():
    request = _request(FORECAST)
    for kind in WRITERS:
        tag = json.dumps(chat_structural_tag(chat_format_make(kind), request))
        assert '"type": "grammar"' in tag, kind


# -- the subset-state rules, checked exhaustively on single-letter fragments -------------------------

def _language_ok(seq: tuple[str, ...], required: set[str], group_of: dict[str, int]) -> bool:
    groups = [group_of[s] for s in seq]
    return len(set(seq)) == len(seq) and required <= set(seq) and groups == sorted(groups)


@pytest.mark.parametrize("group_size", [1, 2, 3, 4])
@pytest.mark.parametrize("required", ["", "a", "bd", "abcd"])
def test_any_order_rules_language(group_size, required):
    letters = "abcd"
    start, lines = any_order_rules([f'"{c}"' for c in letters], [c in required for c in letters], '"<"', '","', "s",
                                   group_size)
    compiled = xgr.GrammarCompiler(_BYTES).compile_grammar(xgr.Grammar.from_ebnf("\n".join([f"root ::= {start}", *lines])))
    group_of = {c: i // group_size for i, c in enumerate(letters)}
    for n in range(6):
        for seq in itertools.product(letters, repeat=n):
            text = ("<" + ",".join(seq)) if seq else ""
            matcher = xgr.GrammarMatcher(compiled)
            accepted = matcher.accept_string(text.encode()) and matcher.is_completed()
            assert accepted == _language_ok(seq, set(required), group_of), (text, group_size, required)
