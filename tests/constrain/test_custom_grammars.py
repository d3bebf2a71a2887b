"""Custom tools' grammars without a model: Lark grammars converted to xgrammar EBNF agree with the `lark` package on
sample texts; a construct with no EBNF equivalent is an error naming it; the JSON-string form of a grammar admits
exactly the JSON escapings of the texts the grammar admits."""

from __future__ import annotations

import json

import pytest
import xgrammar as xgr
from lark import Lark
from lark.exceptions import LarkError as LarkPackageError

from jaxchat.constrain.json_escape import json_string_ebnf
from jaxchat.constrain.lark_ebnf import LarkError, lark_to_ebnf

COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([b"a"]))

ARITH = r"""
start: expr
expr: term (("+" | "-") term)*
term: NUMBER | "(" expr ")" | NAME
NAME: /[a-z_]+/
%import common.NUMBER
%import common.WS
%ignore WS
"""
CONFIG = r"""
start: line+
line: KEY ("=" VALUE)? _NL
KEY: /[a-z]+/
VALUE: ESCAPED_STRING | INT
_NL: "\n"
%import common.ESCAPED_STRING
%import common.INT
%ignore " "
"""
SQL = r"""
start: "SELECT " cols " FROM " NAME (" WHERE " cond)? ";"?
cols: "*" | NAME ("," " "? NAME)*
cond: NAME OP (NAME | INT | "'" /[^']+/ "'")
OP: "=" | "<" | ">" | "<=" | ">=" | "!="
NAME: /[a-z][a-z0-9_]*/
%import common.INT
"""
SAMPLES = {
    "arith": (ARITH, ["1+2", "( x - 3.5 )+y", " 1 \n", "1.5E+3-(a)", "1+", "(1", "1 2", "+", ""]),
    "config": (CONFIG, ['a\n', 'a = "x \\" y"\nb=12\n', 'a=\n', 'A\n', 'a="unterminated\n', "a", 'a = 1 2\n']),
    "sql": (SQL, ["SELECT * FROM t;", "SELECT a, b FROM t WHERE c >= 10", "SELECT a,b FROM t WHERE c='x y'",
                  "SELECT FROM t", "select * from t", "SELECT * FROM t WHERE c == 1"]),
}


def _accepts(ebnf: str, text: str) -> bool:
    matcher = xgr.GrammarMatcher(COMPILER.compile_grammar(ebnf), terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


def _lark_accepts(parser: Lark, text: str) -> bool:
    try:
        parser.parse(text)
    except LarkPackageError:
        return False
    return True


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_lark_grammars_convert_to_the_same_language(name):
    definition, texts = SAMPLES[name]
    ebnf = lark_to_ebnf(definition)
    parser = Lark(definition, parser="earley", lexer="dynamic")
    verdicts = [(text, _lark_accepts(parser, text), _accepts(ebnf, text)) for text in texts]
    assert all(lark == ours for _, lark, ours in verdicts), verdicts
    assert any(lark for _, lark, _ in verdicts) and not all(lark for _, lark, _ in verdicts)


@pytest.mark.parametrize("definition,construct", [
    ("start: /a+/i", "__ANON_0"),
    ('start: "a" B\nB: "b"i', "B"),
    ("start: /(?=a)a/", "__ANON_0"),
    ("start: foo", "definition"),
    ("start: (", "definition"),
    ("start: \"a\" /b*/", "definition"),  # Lark itself refuses zero-width terminals
])
def test_unconvertible_constructs_are_errors_naming_them(definition, construct):
    with pytest.raises(LarkError) as err:
        lark_to_ebnf(definition)
    assert err.value.construct == construct


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_json_string_form_admits_the_escaped_texts(name):
    definition, texts = SAMPLES[name]
    ebnf = lark_to_ebnf(definition)
    inside = "root ::= input\n" + json_string_ebnf(ebnf, "input")
    for text in texts + ['a = "q\\\\"\n', "\t"]:
        escaped = json.dumps(text, ensure_ascii=False)[1:-1]
        assert _accepts(inside, escaped) == _accepts(ebnf, text), text
        if escaped != text:
            assert not _accepts(inside, text) or not _accepts(ebnf, text), text  # raw quotes/newlines are not JSON


def test_json_string_form_of_regex_grammars():
    for pattern, texts in ((r'[^a]{1,3}"\\d', ['b"\\d', '\n\t"\\d', 'a"\\d']),
                           (r"[\x00-\x7f]+", ["\x01\x1f~", '"', "é"]),
                           (r"line [0-9]+\n(more)?", ["line 12\n", "line 12\nmore", "line\n"])):
        raw = str(xgr.Grammar.from_regex(pattern))
        inside = "root ::= input\n" + json_string_ebnf(raw, "input")
        for text in texts:
            assert _accepts(inside, json.dumps(text, ensure_ascii=False)[1:-1]) == _accepts(raw, text), (pattern, text)


# ---- a custom tool's call in each chat format: the grammar admits exactly the input, the parser returns it ------
REGEX = r'[a-z]+( "[a-z]+"\\?)?'
INPUTS = {'ls "dir"\\': True, "ls": True, 'ls "dir': False, "LS": False}


def _call_text(spec, name: str, text: str) -> str:
    from jaxchat.chat import native_call_opening

    if spec.kind == "qwen_xml":
        return f"{spec.tool_start}\n<function={name}>\n<parameter=input>\n{text}\n</parameter>\n</function>\n{spec.tool_end}"
    if spec.kind == "harmony":
        return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{json.dumps({'input': text})}<|call|>"
    if spec.kind == "gemma4":  # the raw input in a verbatim string
        return f'{spec.tool_start}call:{name}{{input:<|"|>{text}<|"|>}}{spec.tool_end}'
    if spec.kind == "lfm2":  # a Python call whose string literal is the input's JSON string
        return f"{spec.tool_start}[{name}(input={json.dumps(text, ensure_ascii=False)})]{spec.tool_end}"
    return native_call_opening(spec, name) + json.dumps({"input": text}) + "}\n" + spec.tool_end


@pytest.mark.parametrize("kind", ["hermes_json", "qwen_xml", "harmony", "gemma4", "lfm2"])
def test_custom_tool_inputs_in_each_format(vocab, kind):
    from jaxchat.chat import chat_constraint_request_from_openai, chat_format_make, chat_parse
    from jaxchat.chat.msg import ChatParseOptions

    spec = chat_format_make(kind)
    body = {"tools": [{"type": "custom", "custom": {"name": "sh", "format": {"type": "grammar", "grammar": {
        "syntax": "regex", "definition": REGEX}}}}], "tool_choice": {"type": "custom", "custom": {"name": "sh"}},
        "think": False}
    request = chat_constraint_request_from_openai(body)
    engine = vocab("harmony" if kind == "harmony" else "qwen25").engine
    for text, ok in INPUTS.items():
        call = _call_text(spec, "sh", text)
        assert engine.accepts(spec, request, "", call)[0] == ok, (kind, text)
        if ok:
            msg = chat_parse(spec, call, False, ChatParseOptions(tools=request.tools))
            assert json.loads(msg.tool_calls[0].arguments) == {"input": text}


@pytest.mark.parametrize("kind", ["gemma4", "lfm2", "qwen_xml"])
def test_custom_tools_beside_function_tools_in_raw_and_python_formats(qwen25, kind):
    """gemma4 and LFM2 carry a Lark and a regex tool beside a function tool under tool_choice required: each input is
    admitted only when its grammar matches it, and reads back exactly (inputs with quotes, newlines, backslashes)."""
    from jaxchat.chat import chat_constraint_request_from_openai, chat_format_make, chat_parse
    from jaxchat.chat.msg import ChatParseOptions

    spec = chat_format_make(kind)
    lark = 'start: WORD ("\\n" WORD)*\nWORD: /[a-z"\\\\]+/'
    body = {"tools": [
        {"type": "custom", "custom": {"name": "sh", "format": {"type": "grammar", "grammar": {
            "syntax": "regex", "definition": REGEX}}}},
        {"type": "custom", "custom": {"name": "lines", "format": {"type": "grammar", "grammar": {
            "syntax": "lark", "definition": lark}}}},
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}],
        "tool_choice": "required", "think": False}
    request = chat_constraint_request_from_openai(body)
    cases = [("sh", text, ok) for text, ok in INPUTS.items()] + [
        ("lines", 'a"b\nc\\d', True), ("lines", "ab\n", False), ("lines", "a b", False), ("sh", 'a\nb', False)]
    for name, text, ok in cases:
        call = _call_text(spec, name, text)
        assert qwen25.engine.accepts(spec, request, "", call)[0] == ok, (name, text)
        if ok:
            msg = chat_parse(spec, call, False, ChatParseOptions(tools=request.tools))
            assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == [(name, {"input": text})]


def test_custom_tools_under_auto_beside_text_and_functions(qwen25):
    """tool_choice auto with a custom and a function tool: plain text, the custom call and the function call are
    each admitted (call envelopes included in the grammar); a custom input off its grammar is not."""
    from jaxchat.chat import chat_constraint_request_from_openai, chat_format_make

    spec = chat_format_make("hermes_json")
    body = {"tools": [{"type": "custom", "custom": {"name": "sh", "format": {"type": "grammar", "grammar": {
        "syntax": "regex", "definition": REGEX}}}},
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]}
    request = chat_constraint_request_from_openai(body)
    function_call = spec.tool_start + '\n{"name": "f", "arguments": {}}\n' + spec.tool_end
    for text, ok in (("Hello there.", True), (_call_text(spec, "sh", "ls"), True), (function_call, True),
                     (_call_text(spec, "sh", "LS"), False)):
        assert qwen25.engine.accepts(spec, request, "", text)[0] == ok, text
