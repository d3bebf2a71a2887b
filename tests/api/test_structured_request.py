"""The structured-output fields read once into one `OutputConstraint` (no model): each spelling's kind and param,
at most one constraint per request (response_format and callable tools counted), the 400s that need no compiler."""

from __future__ import annotations

import json

import pytest

from jaxchat.api import parse_chat_request, parse_completion_request
from jaxchat.chat import RequestError
from jaxchat.constrain.output import choice_grammar

MSGS = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]

SPELLINGS = [
    ({"structured_outputs": {"regex": "[0-9]+"}}, "regex", "structured_outputs.regex"),
    ({"structured_outputs": {"choice": ["a", "b", "a"]}}, "choice", "structured_outputs.choice"),
    ({"structured_outputs": {"grammar": 'root ::= "a"'}}, "grammar", "structured_outputs.grammar"),
    ({"structured_outputs": {"json": SCHEMA}}, "json", "structured_outputs.json"),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}}, "json", "structured_outputs.json"),
    ({"structured_outputs": {"json_object": True}}, "json", "structured_outputs.json_object"),
    ({"guided_regex": "[0-9]+"}, "regex", "guided_regex"),
    ({"guided_choice": ["a", "b"]}, "choice", "guided_choice"),
    ({"guided_grammar": 'root ::= "a"'}, "grammar", "guided_grammar"),
    ({"guided_json": SCHEMA}, "json", "guided_json"),
    ({"regex": "[0-9]+"}, "regex", "regex"),
    ({"ebnf": 'root ::= "a"'}, "grammar", "ebnf"),
    ({"json_schema": json.dumps(SCHEMA)}, "json", "json_schema"),
    ({"grammar": 'root ::= "a"'}, "grammar", "grammar"),
    ({"json_schema": SCHEMA}, "json", "json_schema"),
]


@pytest.mark.parametrize("fields,kind,param", SPELLINGS)
def test_each_spelling_is_one_typed_constraint(fields, kind, param):
    for request in (parse_chat_request({"messages": MSGS, **fields}), parse_completion_request({"prompt": "x", **fields})):
        output = request.constraint.output if hasattr(request, "constraint") else request.output
        assert (output.kind, output.param) == (kind, param)
        if kind == "choice":
            assert output.choices == tuple(dict.fromkeys(fields[param.split(".")[0]]["choice"]
                                                          if "." in param else fields[param]))
        if kind == "json" and param != "structured_outputs.json_object":
            assert output.schema == SCHEMA


def _error(parse, body) -> RequestError:
    with pytest.raises(RequestError) as err:
        parse(body)
    return err.value


@pytest.mark.parametrize("a,b", [
    ({"guided_regex": "a"}, {"structured_outputs": {"choice": ["a"]}}),
    ({"regex": "a"}, {"grammar": 'root ::= "a"'}),
    ({"guided_json": SCHEMA}, {"json_schema": SCHEMA}),
    ({"structured_outputs": {"regex": "a", "grammar": 'root ::= "a"'}}, {}),
])
def test_two_constraints_are_a_400_naming_both(a, b):
    for parse, base in ((parse_chat_request, {"messages": MSGS}), (parse_completion_request, {"prompt": "x"})):
        err = _error(parse, {**base, **a, **b})
        named = [k for k in ("guided_regex", "regex", "grammar", "guided_json", "json_schema",
                             "structured_outputs.choice", "structured_outputs.regex", "structured_outputs.grammar")
                 if k in err.message]
        assert len(named) >= 2 and err.param in named, err.message


def test_response_format_and_tools_count_as_constraints():
    fmt = {"response_format": {"type": "json_object"}}
    err = _error(parse_chat_request, {"messages": MSGS, "guided_regex": "a", **fmt})
    assert err.param == "guided_regex" and "response_format" in err.message
    err = _error(parse_completion_request, {"prompt": "x", "guided_regex": "a", **fmt})
    assert err.param == "guided_regex" and "response_format" in err.message
    err = _error(parse_chat_request, {"messages": MSGS, "guided_choice": ["a"], "tools": TOOLS})
    assert err.param == "guided_choice" and "tools" in err.message
    # tools the model may not call do not constrain the output
    request = parse_chat_request({"messages": MSGS, "guided_choice": ["a"], "tools": TOOLS, "tool_choice": "none"})
    assert request.constraint.output.choices == ("a",)
    # a completion's JSON response_format is its output constraint
    output = parse_completion_request({"prompt": "x", **fmt}).output
    assert (output.kind, output.param, output.schema) == ("json", "response_format", {"type": "object"})


@pytest.mark.parametrize("fields,param,words", [
    ({"guided_choice": []}, "guided_choice", "must not be empty"),
    ({"structured_outputs": {"choice": ["a", 3]}}, "structured_outputs.choice[1]", "expected a string"),
    ({"guided_regex": ""}, "guided_regex", "must not be empty"),
    ({"ebnf": 3}, "ebnf", "as a string"),
    ({"guided_json": "{not json"}, "guided_json", "JSON schema"),
    ({"json_schema": {"type": 12}}, "json_schema", "invalid JSON schema"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag", "not supported"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern", "not supported"),
    ({"guided_whitespace_pattern": " "}, "guided_whitespace_pattern", "not supported"),
    ({"structured_outputs": {"regexp": "a"}}, "structured_outputs.regexp", "unknown"),
    ({"structured_outputs": "a"}, "structured_outputs", "expected an object"),
])
def test_bad_fields_are_400s_naming_them(fields, param, words):
    for parse, base in ((parse_chat_request, {"messages": MSGS}), (parse_completion_request, {"prompt": "x"})):
        err = _error(parse, {**base, **fields})
        assert err.param == param and words in err.message, (err.param, err.message)


def test_backend_fields_are_accepted():
    request = parse_chat_request({"messages": MSGS, "guided_decoding_backend": "xgrammar",
                                  "structured_outputs": {"backend": "xgrammar", "regex": "a"}})
    assert request.constraint.output.text == "a"


def test_choice_grammar_escapes_literals():
    import xgrammar as xgr

    choices = ['say "hi"', "back\\slash", "tab\there", "ünï"]
    grammar = xgr.Grammar.from_ebnf(choice_grammar(choices))
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([c.encode() for c in "abc"]))
    for choice in choices:
        matcher = xgr.GrammarMatcher(compiler.compile_grammar(grammar), terminate_without_stop_token=True)
        assert matcher.accept_string(choice) and matcher.is_terminated(), choice


def test_logit_bias_is_read_and_bounded():
    request = parse_chat_request({"messages": MSGS, "logit_bias": {"7": -100, "3": 2.5, "9": 0}})
    assert request.sampling.logit_bias == ((3, 2.5), (7, float("-inf")))
    for bias, param in (({"7": 101}, "logit_bias.7"), ({"x": 1}, "logit_bias.x"), ({"-1": 1}, "logit_bias.-1"),
                        ({"5": "1"}, "logit_bias.5"), ([1], "logit_bias"),
                        ({str(i): 1 for i in range(33)}, "logit_bias")):
        err = _error(parse_completion_request, {"prompt": "x", "logit_bias": bias})
        assert err.param == param, err.message


def test_custom_tools_and_their_calls_are_read():
    tools = [{"type": "custom", "custom": {"name": "sql", "format": {"type": "grammar", "grammar": {
        "syntax": "lark", "definition": 'start: "SELECT 1"'}}}}, {"type": "custom", "custom": {"name": "note"}}]
    history = [{"role": "user", "content": "q"},
               {"role": "assistant", "tool_calls": [{"id": "c1", "type": "custom",
                                                     "custom": {"name": "sql", "input": 'SELECT "1"'}}]},
               {"role": "tool", "tool_call_id": "c1", "content": "1"}]
    request = parse_chat_request({"messages": history, "tools": tools,
                                  "tool_choice": {"type": "custom", "custom": {"name": "sql"}}})
    assert request.constraint.named_tool == "sql"
    assert [t["custom"]["syntax"] for t in request.constraint.tools] == ["lark", "text"]
    call = request.messages[1]["tool_calls"][0]
    assert call == {"id": "c1", "type": "function", "function": {"name": "sql", "arguments": '{"input": "SELECT \\"1\\""}'}}
    bad = [*history[:1], {"role": "assistant", "tool_calls": [{"type": "custom", "custom": {"name": "sql"}}]}]
    assert _error(parse_chat_request, {"messages": bad}).param == "messages[1].tool_calls[0].custom.input"


def test_gbnf_any_character_is_read():
    import xgrammar as xgr

    from jaxchat.constrain.output import gbnf_to_ebnf

    grammar = gbnf_to_ebnf('root ::= "id:" .{2} "." # a comment with . in it\n')
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([c.encode() for c in "abc"]))
    for text, ok in (("id:x\n.", True), ("id:é!.", True), ("id:x.", False)):
        matcher = xgr.GrammarMatcher(compiler.compile_grammar(grammar), terminate_without_stop_token=True)
        assert (matcher.accept_string(text) and matcher.is_terminated()) == ok, text
