"""Tool-call argument dialects: canonical JSON, the prefix property at every split, and errors.

Expected values come from reference implementations (json.loads of a reference JSON text,
ast.literal_eval of the Python source, or the generated value itself), never from our output.
"""

from __future__ import annotations

import ast
import json
import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from jaxchat.chat.args import (
    ArgumentSyntaxError,
    ParsedCall,
    parse_gemma4_call,
    parse_hermes_call,
    parse_json_arguments,
    parse_python_calls,
    parse_qwen_xml_call,
)

GEMMA_QUOTE = '<|"|>'


def dumps(value: object) -> str:
    """A strict fingerprint: 1 vs 1.0 vs True and key order all differ."""
    return json.dumps(value, ensure_ascii=False)


def assert_same_value(arguments: str, expected: object) -> None:
    assert dumps(json.loads(arguments)) == dumps(expected)


def assert_canonical(arguments: str) -> None:
    """Canonical formatting: exactly what json.dumps writes for the parsed value (modulo numbers)."""
    value = json.loads(arguments)
    number = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
    assert re.sub(number, "0", arguments) == re.sub(number, "0", dumps(value))


def assert_extends(before: ParsedCall, after: ParsedCall) -> None:
    if before.name is not None:
        assert after.name == before.name
    assert after.arguments.startswith(before.arguments), (before.arguments, after.arguments)


def assert_prefix_stable(parse, body: str) -> ParsedCall:
    """Parse every prefix of `body` partially; each result extends the previous one and the final."""
    final = parse(body, False)
    assert final.complete and final.name is not None
    previous = ParsedCall(None, "", False, 0)
    for cut in range(len(body) + 1):
        current = parse(body[:cut], True)
        assert_extends(previous, current)
        assert_extends(current, final)
        previous = current
    assert previous.complete and previous.arguments == final.arguments and previous.end == final.end
    assert not body[final.end :].strip()
    assert_canonical(final.arguments)
    return final


def assert_prefix_stable_calls(body: str) -> list[ParsedCall]:
    final = parse_python_calls(body, False)
    assert all(call.complete for call in final)
    previous: list[ParsedCall] = []
    for cut in range(len(body) + 1):
        current = parse_python_calls(body[:cut], True)
        assert len(previous) <= len(current) <= len(final)
        for before, after in zip(previous, current):
            assert_extends(before, after)
        for now, last in zip(current, final):
            assert_extends(now, last)
        previous = current
    assert previous == final
    for call in final:
        assert_canonical(call.arguments)
    return final


# -- reference readers -----------------------------------------------------------------------------
def json_like(value: object) -> object:
    if isinstance(value, (list, tuple)):
        return [json_like(item) for item in value]
    if isinstance(value, dict):
        return {key: json_like(item) for key, item in value.items()}
    return value


def python_reference(body: str) -> list[tuple[str, dict]]:
    tree = ast.parse(body.strip(), mode="eval").body
    calls = tree.elts if isinstance(tree, ast.List) else [tree]
    return [
        (call.func.id, {kw.arg: json_like(ast.literal_eval(kw.value)) for kw in call.keywords}) for call in calls
    ]


def untyped_reference(value: str) -> object:
    try:
        decoded = json.loads(value.strip())
        json.dumps(decoded, allow_nan=False)
    except ValueError:
        return value
    return decoded


# -- examples: JSON / Hermes -----------------------------------------------------------------------
HERMES_EXAMPLES = [
    ('\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n', "get_weather",
     '{"city": "Paris", "days": 3}'),
    ('{"name": "ping", "arguments": {}}', "ping", "{}"),
    ('{"name": "ping"}', "ping", "{}"),
    ('{"name": "ping", "arguments": null}', "ping", "{}"),
    ('{"arguments": {"q": "x"}, "name": "search"}', "search", '{"q": "x"}'),
    ('{"name": "f", "parameters": {"a": -1.5e3, "b": false, "c": null, "d": true, "e": -0}}', "f",
     '{"a": -1500.0, "b": false, "c": null, "d": true, "e": 0}'),
    (('{"name": "f", "arguments": {"city": "Zürich", "emoji": "😀", "cjk": "北京",'
      ' "esc": "q\\"uote\\nline\\u00e9\\ud83d\\ude00 \\/ \\\\"}}'), "f",
     ('{"city": "Z\\u00fcrich", "emoji": "\\ud83d\\ude00", "cjk": "\\u5317\\u4eac",'
      ' "esc": "q\\"uote\\nline\\u00e9\\ud83d\\ude00 / \\\\"}')),
    ('{"name": "f", "arguments": {"a": {"b": [1, {"c": [[], {}]}]}, "n": [0.5, -2, 1E+2]}}', "f",
     '{"a": {"b": [1, {"c": [[], {}]}]}, "n": [0.5, -2, 100.0]}'),
    ('{"id": "call_1", "name": "f", "arguments": {"a": 1}, "extra": [1, {"x": null}]}', "f", '{"a": 1}'),
    ('  {\n  "name" : "f" ,\n  "arguments" : {\n    "a" : [ 1 , 2 ]\n  }\n}  ', "f", '{"a": [1, 2]}'),
]


@pytest.mark.parametrize("body, name, reference", HERMES_EXAMPLES)
def test_hermes_examples(body, name, reference):
    final = assert_prefix_stable(parse_hermes_call, body)
    assert final.name == name
    assert_same_value(final.arguments, json.loads(reference))


@pytest.mark.parametrize(
    "arguments",
    [{"a": [1, 2], "b": "\u00e9 \"q\" \\ \n"}, {}, {"nested": {"x": [True, None, -1.25]}}],
)
@pytest.mark.parametrize("key", ["arguments", "parameters"])
def test_hermes_string_encoded_arguments(arguments, key):
    body = json.dumps({"name": "f", key: json.dumps(arguments)})
    final = assert_prefix_stable(parse_hermes_call, body)
    assert final.name == "f"
    assert_same_value(final.arguments, arguments)


def test_hermes_empty_string_arguments():
    assert parse_hermes_call('{"name": "f", "arguments": ""}', False).arguments == "{}"


def test_hermes_arguments_before_name_are_withheld():
    partial = parse_hermes_call('{"arguments": {"q": "x"}, "na', True)
    assert partial == ParsedCall(None, "", False, len('{"arguments": {"q": "x"}, "na'))


def test_json_arguments_canonical_output():
    text = '{ "a" :1,"b":[true ,null],"c":"\\u00e9\\t","d":{}}  trailing'
    assert parse_json_arguments(text, False) == ('{"a": 1, "b": [true, null], "c": "é\\t", "d": {}}', True, 48)
    assert parse_json_arguments("  ", True) == ("", False, 2)
    assert parse_json_arguments("-12", False) == ("-12", True, 3)


@pytest.mark.parametrize(
    "text, shown",
    [
        ('{"a": 12', '{"a": '),  # a number is held until it ends
        ('{"a": 12 ', '{"a": 12'),
        ('{"a": tr', '{"a": '),
        ('{"a": "x\\u00', '{"a": "x'),  # an incomplete escape is held
        ('{"a": "x\\', '{"a": "x'),
        ('{"a": "x\\ud83d', '{"a": "x'),  # a high surrogate waits for its low half
        ('{"a": "x\\ud83d\\ude', '{"a": "x'),
        ('{"a": "x\\ud83d!', '{"a": "x\\ud83d!'),  # a lone surrogate stays escaped
        ('{"ab', "{"),  # keys appear only when complete
        ('{"ab"', "{"),
        ('{"ab":', '{"ab": '),
        ("[1,", "[1"),  # the separator waits for the next element
        ("[1, ", "[1"),
        ('[1, "', '[1, "'),
        ('{"a": "raw\nnewline', '{"a": "raw\\nnewline'),
    ],
)
def test_json_partial_holds_back(text, shown):
    assert parse_json_arguments(text, True)[0] == shown


# -- examples: LFM2 Python -------------------------------------------------------------------------
PYTHON_EXAMPLES = [
    "[get_weather(city=\"Paris\", days=3), search(q='x', opts={\"a\": [1, True, None]})]",
    "[ping()]",
    "ping()",
    "[f(a=-3, b=2.5, c=-1e-3, d=0x1F, e=1_000, f=.5, g=5., h=+7, i=1E5)]",
    "[f(s='it\\'s', t=\"q\\\"uote\\n\\t\\u00e9\\x41\\N{EM DASH}\\101\", u=\"Zürich 😀 北京\", v='\\U0001F600')]",
    "[f(t=(1, 2), e=(), single=(\"x\",), d={}, n=[[], {'k': (None,)}])]",
    "[f(a=1,), g(b=[1, 2,], c={'x': 1,},)]",
    "[ a ( x = 1 ) , b ( ) ]",
    "[f(a=True, b=False, c=None, d=[False])]",
]


@pytest.mark.parametrize("body", PYTHON_EXAMPLES)
def test_python_examples(body):
    final = assert_prefix_stable_calls(body)
    reference = python_reference(body)
    assert [call.name for call in final] == [name for name, _ in reference]
    for call, (_, arguments) in zip(final, reference):
        assert_same_value(call.arguments, arguments)


def test_python_unknown_escape_keeps_backslash():
    assert parse_python_calls("[f(a='\\d')]", False)[0].arguments == '{"a": "\\\\d"}'


def test_python_incomplete_calls():
    body = '[get_weather(city="Paris"), sear'
    assert [c.name for c in parse_python_calls(body, True)] == ["get_weather"]
    calls = parse_python_calls(body + 'ch(q="a', True)
    assert calls[1] == ParsedCall("search", '{"q": "a', False, len(body) + 7)
    assert calls[0].end == len('[get_weather(city="Paris")')


# -- examples: Gemma 4 -----------------------------------------------------------------------------
GEMMA_EXAMPLES = [
    ('call:get_weather{city:<|"|>Paris<|"|>,days:3,opts:{units:<|"|>c<|"|>,list:[1,2]}}', "get_weather",
     '{"city": "Paris", "days": 3, "opts": {"units": "c", "list": [1, 2]}}'),
    ("call:ping{}", "ping", "{}"),
    ("call:f{a:-1.5,b:true,c:null,d:false,e:1e5}", "f", '{"a": -1.5, "b": true, "c": null, "d": false, "e": 1e5}'),
    ('call:f{text:<|"|>He said "hi"\nC:\\path Zürich 😀 北京<|"|>,j:"json \\u00e9 \\"q\\""}', "f",
     '{"text": "He said \\"hi\\"\\nC:\\\\path Z\\u00fcrich \\ud83d\\ude00 \\u5317\\u4eac", "j": "json \\u00e9 \\"q\\""}'),
    ('call:f{rows:[{id:1,tags:[<|"|>a<|"|>,<|"|>b<|"|>]},{id:2,tags:[]}]}', "f",
     '{"rows": [{"id": 1, "tags": ["a", "b"]}, {"id": 2, "tags": []}]}'),
    ('call:f{<|"|>odd key<|"|>:<|"|><|"|>, "k2" : 1 }', "f", '{"odd key": "", "k2": 1}'),
]


@pytest.mark.parametrize("body, name, reference", GEMMA_EXAMPLES)
def test_gemma_examples(body, name, reference):
    final = assert_prefix_stable(parse_gemma4_call, body)
    assert final.name == name
    assert_same_value(final.arguments, json.loads(reference))


def test_gemma_holds_partial_quote():
    assert parse_gemma4_call('call:f{a:<|"|>x<|"', True).arguments == '{"a": "x'
    assert parse_gemma4_call('call:f{a:<|"|>x<|"|', True).arguments == '{"a": "x'
    assert parse_gemma4_call('call:f{a:<|', True).arguments == '{"a": '
    assert parse_gemma4_call("call:f{ab", True).arguments == "{"


# -- examples: Qwen XML ----------------------------------------------------------------------------
SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "temp": {"type": "number"},
        "metric": {"type": "boolean"},
        "code": {"type": "string"},
        "opts": {"type": "object"},
        "tags": {"type": "array"},
        "maybe": {"type": ["integer", "null"]},
        "choice": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "mode": {"enum": ["fast", "slow"]},
    },
}


def xml_call(name: str, *params: tuple[str, str]) -> str:
    inner = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in params)
    return f"\n<function={name}>\n{inner}</function>\n"


QWEN_EXAMPLES = [
    (xml_call("get_weather", ("city", "Paris"), ("days", "3")), SCHEMA, '{"city": "Paris", "days": 3}'),
    ("<function=ping>\n</function>", SCHEMA, "{}"),
    ("<function=ping></function>", None, "{}"),
    (xml_call("f", ("temp", "-3.5"), ("metric", "True"), ("code", "3"), ("days", " 42 "), ("maybe", "null"),
              ("choice", "2.5e1"), ("mode", "fast")), SCHEMA,
     '{"temp": -3.5, "metric": true, "code": "3", "days": 42, "maybe": null, "choice": 25.0, "mode": "fast"}'),
    (xml_call("f", ("opts", '{"units": "c", "deep": [1, {"x": null}]}'), ("tags", "['a', True, None, (1,)]")),
     SCHEMA, '{"opts": {"units": "c", "deep": [1, {"x": null}]}, "tags": ["a", true, null, [1]]}'),
    (xml_call("f", ("unknown", "42"), ("free", "hello world"), ("obj", '{"a": 1}'), ("broken", "[1, 2"),
              ("flag", "false"), ("quoted", '"x"')), SCHEMA,
     '{"unknown": 42, "free": "hello world", "obj": {"a": 1}, "broken": "[1, 2", "flag": false, "quoted": "x"}'),
    (xml_call("f", ("city", "line1\n\nline2\n"), ("code", "")), SCHEMA, '{"city": "line1\\n\\nline2\\n", "code": ""}'),
    (xml_call("f", ("city", 'Zürich "quoted" \\ back <tag> 😀 北京')), SCHEMA,
     '{"city": "Z\\u00fcrich \\"quoted\\" \\\\ back <tag> \\ud83d\\ude00 \\u5317\\u4eac"}'),
    (xml_call("f", ("days", "3"), ("code", "007")), None, '{"days": 3, "code": "007"}'),
]


@pytest.mark.parametrize("body, schema, reference", QWEN_EXAMPLES)
def test_qwen_xml_examples(body, schema, reference):
    final = assert_prefix_stable(lambda text, partial: parse_qwen_xml_call(text, partial, schema), body)
    assert_same_value(final.arguments, json.loads(reference))


def test_qwen_xml_streams_strings_and_holds_markers():
    head = "<function=f>\n<parameter=city>\n"
    for tail, shown in [("", '{"city": "'), ("Pa", '{"city": "Pa'), ("Paris\n", '{"city": "Paris'),
                        ("Paris\n</para", '{"city": "Paris'), ("Paris</p", '{"city": "Paris'),
                        ("Paris\n\n", '{"city": "Paris\\n')]:
        assert parse_qwen_xml_call(head + tail, True, SCHEMA).arguments == shown
    assert parse_qwen_xml_call("<function=f>\n<parameter=days>\n12", True, SCHEMA).arguments == '{"days": '
    assert parse_qwen_xml_call("<function=get_wea", True, SCHEMA) == ParsedCall(None, "", False, 17)


# -- property tests --------------------------------------------------------------------------------
SPECIAL_CHARS = ['"', "'", "\\", "\n", "\t", "\r", "\x00", "\x1f", "é", "😀", "中", "<", ">", "|", "/", "{", "}",
                 ",", ":", "=", " ", "\u2028", "u"]
TEXT = st.text(st.one_of(st.characters(exclude_categories=("Cs",)), st.sampled_from(SPECIAL_CHARS)), max_size=6)
IDENTIFIERS = st.from_regex(r"[a-z_][a-z0-9_]{0,5}", fullmatch=True)
SCALARS = (
    st.none() | st.booleans() | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False) | TEXT
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3), max_leaves=6
)
ARGUMENTS = st.dictionaries(IDENTIFIERS, VALUES, max_size=3)
PROPERTY_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY_SETTINGS
@given(st.data(), ARGUMENTS)
def test_property_hermes(data, arguments):
    def dump(value: object) -> str:
        return json.dumps(
            value,
            ensure_ascii=data.draw(st.booleans()),
            indent=data.draw(st.sampled_from([None, 0, 2])),
            separators=data.draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : ")])),
        )

    rendered = dump(arguments)
    if data.draw(st.booleans(), "string-encoded"):
        rendered = json.dumps(rendered, ensure_ascii=data.draw(st.booleans()))
    key = data.draw(st.sampled_from(["arguments", "parameters"]))
    fields = [f'"name": "{data.draw(IDENTIFIERS)}"', f'"{key}": {rendered}']
    if data.draw(st.booleans(), "arguments first"):
        fields.reverse()
    final = assert_prefix_stable(parse_hermes_call, "\n{" + ", ".join(fields) + "}\n")
    assert_same_value(final.arguments, arguments)


def python_literal(value: object, tuples: bool) -> str:
    if isinstance(value, list):
        inner = ", ".join(python_literal(item, tuples) for item in value)
        return f"({inner},)" if tuples and value else f"[{inner}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {python_literal(v, tuples)}" for k, v in value.items()) + "}"
    return repr(value)


@PROPERTY_SETTINGS
@given(st.lists(st.tuples(IDENTIFIERS, ARGUMENTS), min_size=1, max_size=2), st.booleans())
def test_property_python(calls, tuples):
    body = "[" + ", ".join(
        f"{name}(" + ", ".join(f"{k}={python_literal(v, tuples)}" for k, v in arguments.items()) + ")"
        for name, arguments in calls
    ) + "]"
    final = assert_prefix_stable_calls(body)
    assert [call.name for call in final] == [name for name, _ in calls]
    for call, (_, arguments) in zip(final, calls):
        assert_same_value(call.arguments, arguments)


def gemma_literal(value: object) -> str:
    if isinstance(value, str):
        return GEMMA_QUOTE + value + GEMMA_QUOTE
    if isinstance(value, list):
        return "[" + ",".join(gemma_literal(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{gemma_key(k)}:{gemma_literal(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def strings_in(value: object):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from strings_in(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from strings_in(item)


def gemma_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) else gemma_literal(key)


@PROPERTY_SETTINGS
@given(IDENTIFIERS, ARGUMENTS)
def test_property_gemma(name, arguments):
    assume(not any(GEMMA_QUOTE in text for text in strings_in(arguments)))  # unrepresentable in Gemma
    body = f"call:{name}{gemma_literal(arguments)}"
    final = assert_prefix_stable(parse_gemma4_call, body)
    assert final.name == name
    assert_same_value(final.arguments, arguments)


JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null",
              dict: "object", list: "array"}


@PROPERTY_SETTINGS
@given(st.data(), IDENTIFIERS, ARGUMENTS)
def test_property_qwen_xml(data, name, arguments):
    properties, params, expected = {}, [], {}
    for key, value in arguments.items():
        typed = data.draw(st.booleans(), f"typed {key}")
        if isinstance(value, str):
            rendered = value
            expected[key] = value if typed else untyped_reference(value)
        elif typed and isinstance(value, (dict, list)) and data.draw(st.booleans(), "python literal"):
            rendered, expected[key] = python_literal(value, tuples=False), value
        else:
            rendered, expected[key] = json.dumps(value, ensure_ascii=data.draw(st.booleans())), value
        if typed:
            properties[key] = {"type": JSON_TYPES[type(value)]}
        params.append((key, rendered))
    body = xml_call(name, *params)
    assume("</parameter>" not in "".join(rendered for _, rendered in params))
    schema = {"type": "object", "properties": properties}
    final = assert_prefix_stable(lambda text, partial: parse_qwen_xml_call(text, partial, schema), body)
    assert final.name == name
    assert_same_value(final.arguments, expected)


@PROPERTY_SETTINGS
@given(VALUES, st.sampled_from([None, 0, 2]), st.booleans())
def test_property_json_value(value, indent, ensure_ascii):
    text = json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)
    final, complete, end = parse_json_arguments(text, False)
    assert complete and end == len(text)
    assert_same_value(final, value)
    assert_canonical(final)
    previous = ""
    for cut in range(len(text) + 1):
        current = parse_json_arguments(text[:cut], True)[0]
        assert current.startswith(previous) and final.startswith(current)
        previous = current


# -- errors ----------------------------------------------------------------------------------------
def json_args(text, partial):
    return parse_json_arguments(text, partial)


def qwen(text, partial):
    return parse_qwen_xml_call(text, partial, SCHEMA)


@pytest.mark.parametrize(
    "parse, text, partial, offset",
    [
        (json_args, '{"a": 1,}', False, 8),
        (json_args, '{"a" 1}', True, 5),
        (json_args, "[1 2]", True, 3),
        (json_args, '{"a": tru}', False, 6),
        (json_args, '{"a": tx', True, 6),
        (json_args, '{"a": "x\\q"}', True, 8),
        (json_args, '{"a": "\\u12g4"}', True, 7),
        (json_args, '{"a": 01}', False, 6),
        (json_args, "{'a': 1}", True, 1),
        (json_args, "", False, 0),
        (json_args, '{"a": 1', False, 7),
        (json_args, '{"a": "x', False, 6),
        (json_args, "[" * 200, True, 128),
        (parse_hermes_call, '{"name": 3}', True, 9),
        (parse_hermes_call, '{"arguments": {}}', False, 16),
        (parse_hermes_call, '[{"name": "f"}]', True, 0),
        (parse_hermes_call, '{"name": "f", "name": "g"}', True, 14),
        (parse_hermes_call, '{"name": "f", "arguments": "{bad"}', True, 27),
        (parse_hermes_call, '{"name": "f", "arguments": "{} x"}', False, 27),
        (parse_python_calls, '[f("Paris")]', True, 3),
        (parse_python_calls, "[f(a=1) g()]", True, 8),
        (parse_python_calls, "[f(a=1)] x", True, 9),
        (parse_python_calls, "[f(a=inf)]", False, 5),
        (parse_python_calls, "[f(a={1: 2})]", True, 6),
        (parse_python_calls, "[f(a=1", False, 6),
        (parse_python_calls, "[f(a='x\\N{NOT A REAL NAME}')]", True, 7),
        (parse_gemma4_call, "cal:f{}", True, 0),
        (parse_gemma4_call, "call:f{a:Paris}", True, 9),
        (parse_gemma4_call, 'call:f{a:<|"|>x', False, 9),
        (parse_gemma4_call, "call:f(a:1)", True, 6),
        (qwen, "<function=f>\n<param=x>", True, 13),
        (qwen, "<function=f>\n<parameter=days>\n1\n", False, 29),
        (qwen, "<fun", False, 4),
        (qwen, "hello", True, 0),
        (qwen, "<function=f>\n<parameter=opts>\n{x}\n</parameter>", True, 31),
        (qwen, "<function=f>\n<parameter=opts>\n{x", True, 31),
    ],
)
def test_errors_name_the_offset(parse, text, partial, offset):
    with pytest.raises(ArgumentSyntaxError, match=rf"at offset {offset}\b"):
        parse(text, partial)


def test_qwen_xml_enum_value_whitespace_is_padding():
    from jaxchat.chat.args import parse_qwen_xml_call

    schema = {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}, "city": {"type": "string"}}}
    body = "\n<function=get_weather>\n<parameter=city>\n Paris \n</parameter>\n<parameter=unit>\n\n\tc \n</parameter>\n</function>\n"
    call = parse_qwen_xml_call(body, False, schema)
    assert json.loads(call.arguments) == {"city": " Paris ", "unit": "c"}
    for cut in range(len(body)):  # the enum value is held until it is complete, so no prefix shows the padding
        partial = parse_qwen_xml_call(body[:cut], True, schema)
        assert call.arguments.startswith(partial.arguments)
