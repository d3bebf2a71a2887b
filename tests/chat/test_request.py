"""Tests for `chat_constraint_request_from_openai`: 400s with exact params, normalisation, SDK shapes."""

from __future__ import annotations

import copy
import subprocess
import sys

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxchat.api import Limits
from jaxchat.chat.request import ConstraintRequest, RequestError, chat_constraint_request_from_openai

LIMITS = Limits()  # the bounds the server and jaxchat.LLM pass by default
MAX_TOOLS, MAX_SCHEMA_DEPTH = LIMITS.max_tools, LIMITS.max_schema_depth


def parse(body):
    return chat_constraint_request_from_openai(body, max_tools=MAX_TOOLS, max_schema_depth=MAX_SCHEMA_DEPTH)

EMPTY_PARAMS = {"type": "object", "properties": {}}


def tool(name="get_weather", **function):
    return {"type": "function", "function": {"name": name, **function}}


def tools(*names):
    return [tool(n) for n in names]


def named(name):
    return {"type": "function", "function": {"name": name}}


def allowed(mode, *names):
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": [named(n) for n in names]}}


def nested_schema(levels):
    """An object schema `levels` object-levels deep (two JSON containers per level)."""
    schema = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


TWO = tools("a", "b")

# (body, param, message fragment)
ERRORS = [
    # body
    ([], None, "must be a JSON object"),
    ("x", None, "got string 'x'"),
    # tools
    ({"tools": {"a": 1}}, "tools", "expected an array of tool objects, got an object"),
    ({"tools": "get_weather"}, "tools", "got string 'get_weather'"),
    ({"tools": tools(*(f"f{i}" for i in range(MAX_TOOLS + 1)))}, "tools", f"at most {MAX_TOOLS} tools"),
    ({"tools": [None]}, "tools[0]", "expected a tool object, got null"),
    ({"tools": [tool("a"), 3]}, "tools[1]", "got number 3"),
    ({"tools": [{"type": "mcp", "custom": {"name": "x"}}]}, "tools[0].type", "expected a 'function' or 'custom' tool"),
    ({"tools": [{"type": "custom"}]}, "tools[0].custom", "missing required field"),
    ({"tools": [{"type": "custom", "custom": {"name": "x", "format": {"type": "grammar", "grammar": {
        "syntax": "peg", "definition": "x"}}}}]}, "tools[0].custom.format.grammar.syntax", "expected 'lark' or 'regex'"),
    ({"tools": [{"type": "custom", "custom": {"name": "x", "format": {"type": "grammar", "grammar": {
        "syntax": "regex", "definition": ""}}}}]}, "tools[0].custom.format.grammar.definition", "non-empty"),
    ({"tools": [{"type": "custom", "custom": {"name": "x", "format": {"type": "json"}}}]},
     "tools[0].custom.format.type", "expected 'text' or 'grammar'"),
    ({"tools": [{"type": 1, "function": {"name": "x"}}]}, "tools[0].type", "got number 1"),
    ({"tools": [{"type": "function"}]}, "tools[0].function", "missing required field"),
    ({"tools": [{"type": "function", "function": None}]}, "tools[0].function", "missing required field"),
    ({"tools": [{"type": "function", "function": "f"}]}, "tools[0].function", "expected a function definition"),
    ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name", "missing required field"),
    ({"tools": [tool(None)]}, "tools[0].function.name", "missing required field"),
    ({"tools": [tool(7)]}, "tools[0].function.name", "as a string, got number 7"),
    ({"tools": [tool("has space")]}, "tools[0].function.name", "invalid function name 'has space'"),
    ({"tools": [tool("")]}, "tools[0].function.name", "1 to 64 characters"),
    ({"tools": [tool("x" * 65)]}, "tools[0].function.name", "1 to 64 characters"),
    ({"tools": [tool("a.b")]}, "tools[0].function.name", "invalid function name"),
    ({"tools": [tool("é")]}, "tools[0].function.name", "invalid function name"),
    ({"tools": tools("a", "b", "c", "b")}, "tools[3].function.name", "duplicate function name 'b': tools[1]"),
    ({"tools": [tool(description=5)]}, "tools[0].function.description", "expected a string, got number 5"),
    ({"tools": [tool(parameters="{}")]}, "tools[0].function.parameters", "expected a JSON schema object"),
    ({"tools": [tool(parameters=[])]}, "tools[0].function.parameters", "got an array"),
    ({"tools": [tool(parameters={"type": "string"})]}, "tools[0].function.parameters", "of type 'object'"),
    ({"tools": [tool(parameters={"type": ["object"]})]}, "tools[0].function.parameters", "of type 'object'"),
    (
        {"tools": [tool(parameters={"type": "object", "properties": []})]},
        "tools[0].function.parameters.properties",
        "expected an object mapping names",
    ),
    (
        {"tools": [tool(parameters={"type": "object", "required": "a"})]},
        "tools[0].function.parameters.required",
        "array of property names",
    ),
    (
        {"tools": [tool(parameters={"type": "object", "required": [1]})]},
        "tools[0].function.parameters.required",
        "array of property names",
    ),
    (
        {"tools": [tool(parameters=nested_schema(MAX_SCHEMA_DEPTH))]},
        "tools[0].function.parameters",
        "nested too deeply",
    ),
    (
        {"tools": [tool(parameters={"type": "object", "default": {1, 2}})]},
        "tools[0].function.parameters",
        "only JSON values, got a set",
    ),
    ({"tools": [tool(parameters={"type": "object", 1: {}})]}, "tools[0].function.parameters", "keys must be strings"),
    ({"tools": [tool(strict="yes")]}, "tools[0].function.strict", "expected a boolean"),
    ({"tools": [tool(strict=1)]}, "tools[0].function.strict", "got number 1"),
    # tool_choice
    ({"tool_choice": 1}, "tool_choice", "got number 1"),
    ({"tool_choice": True}, "tool_choice", "got boolean true"),
    ({"tool_choice": ["auto"]}, "tool_choice", "got an array"),
    ({"tools": TWO, "tool_choice": "any"}, "tool_choice", "expected 'none', 'auto', 'required'"),
    ({"tools": TWO, "tool_choice": "Required"}, "tool_choice", "got string 'Required'"),
    ({"tool_choice": "required"}, "tool_choice", "needs at least one tool"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice", "needs at least one tool"),
    ({"tool_choice": named("a")}, "tool_choice", "needs at least one tool"),
    ({"tools": None, "tool_choice": named("a")}, "tool_choice", "needs at least one tool"),
    ({"tool_choice": allowed("auto", "a")}, "tool_choice", "needs at least one tool"),
    ({"tools": TWO, "tool_choice": {}}, "tool_choice.type", "missing required field"),
    (
        {"tools": TWO, "tool_choice": {"type": "mcp", "custom": {"name": "a"}}},
        "tool_choice.type",
        "expected 'function', 'custom' or 'allowed_tools', got string 'mcp'",
    ),
    ({"tools": TWO, "tool_choice": {"type": "function"}}, "tool_choice.function", "missing required field"),
    ({"tools": TWO, "tool_choice": {"type": "function", "function": "a"}}, "tool_choice.function", "got string 'a'"),
    (
        {"tools": TWO, "tool_choice": {"type": "function", "function": {}}},
        "tool_choice.function.name",
        "missing required field",
    ),
    (
        {"tools": TWO, "tool_choice": {"type": "function", "function": {"name": 3}}},
        "tool_choice.function.name",
        "got number 3",
    ),
    ({"tools": TWO, "tool_choice": named("c")}, "tool_choice.function.name", "unknown function 'c'"),
    ({"tools": TWO, "tool_choice": {"type": "function", "name": "c"}}, "tool_choice.name", "unknown function 'c'"),
    ({"tools": TWO, "tool_choice": {"type": "allowed_tools"}}, "tool_choice.allowed_tools", "missing required field"),
    (
        {"tools": TWO, "tool_choice": {"type": "allowed_tools", "allowed_tools": ["a"]}},
        "tool_choice.allowed_tools",
        "got an array",
    ),
    (
        {"tools": TWO, "tool_choice": {"type": "allowed_tools", "allowed_tools": {"tools": [named("a")]}}},
        "tool_choice.allowed_tools.mode",
        "missing required field",
    ),
    (
        {"tools": TWO, "tool_choice": allowed("none", "a")},
        "tool_choice.allowed_tools.mode",
        "expected 'auto' or 'required', got string 'none'",
    ),
    (
        {"tools": TWO, "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto"}}},
        "tool_choice.allowed_tools.tools",
        "missing required field",
    ),
    (
        {"tools": TWO, "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": "a"}}},
        "tool_choice.allowed_tools.tools",
        "expected an array",
    ),
    ({"tools": TWO, "tool_choice": allowed("required")}, "tool_choice.allowed_tools.tools", "at least one of the tool"),
    (
        {"tools": TWO, "tool_choice": allowed("auto", "a", "zz")},
        "tool_choice.allowed_tools.tools[1].function.name",
        "unknown function 'zz'",
    ),
    (
        {"tools": TWO, "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": ["a"]}}},
        "tool_choice.allowed_tools.tools[0]",
        "expected a tool reference object",
    ),
    (
        {
            "tools": TWO,
            "tool_choice": {
                "type": "allowed_tools",
                "allowed_tools": {"mode": "auto", "tools": [{"type": "mcp", "function": {"name": "a"}}]},
            },
        },
        "tool_choice.allowed_tools.tools[0].type",
        "expected a 'function' or 'custom' tool reference",
    ),
    (
        {
            "tools": TWO,
            "tool_choice": {
                "type": "allowed_tools",
                "allowed_tools": {"mode": "auto", "tools": [{"type": "function"}]},
            },
        },
        "tool_choice.allowed_tools.tools[0].function",
        "missing required field",
    ),
    # parallel_tool_calls
    ({"parallel_tool_calls": "true"}, "parallel_tool_calls", "expected a boolean (true or false), got string"),
    ({"parallel_tool_calls": 0}, "parallel_tool_calls", "got number 0"),
    # response_format
    ({"response_format": "json_object"}, "response_format", "got string 'json_object'"),
    ({"response_format": {}}, "response_format.type", "missing required field"),
    (
        {"response_format": {"type": "json"}},
        "response_format.type",
        "expected 'text', 'json_object' or 'json_schema', got string 'json'",
    ),
    ({"response_format": {"type": 2}}, "response_format.type", "got number 2"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "missing required field"),
    ({"response_format": {"type": "json_schema", "json_schema": []}}, "response_format.json_schema", "got an array"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
        "response_format.json_schema.name",
        "missing required field",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}},
        "response_format.json_schema.name",
        "invalid response format name 'a b'",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": "{}"}}},
        "response_format.json_schema.schema",
        "expected a JSON schema object, got string",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": True}}},
        "response_format.json_schema.schema",
        "got boolean true",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": nested_schema(40)}}},
        "response_format.json_schema.schema",
        f"more than {MAX_SCHEMA_DEPTH} levels",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "strict": "true"}}},
        "response_format.json_schema.strict",
        "expected a boolean",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "description": ["d"]}}},
        "response_format.json_schema.description",
        "expected a string, got an array",
    ),
    # thinking
    ({"think": "no"}, "think", "expected a boolean"),
    ({"think": 0}, "think", "got number 0"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort", "expected one of 'none', 'minimal', 'low'"),
    ({"reasoning_effort": "HIGH"}, "reasoning_effort", "got string 'HIGH'"),
    ({"reasoning_effort": 1}, "reasoning_effort", "got number 1"),
    ({"reasoning_effort": False}, "reasoning_effort", "got boolean false"),
    ({"chat_template_kwargs": "enable_thinking=false"}, "chat_template_kwargs", "expected an object"),
    ({"chat_template_kwargs": [["enable_thinking", False]]}, "chat_template_kwargs", "got an array"),
    (
        {"chat_template_kwargs": {"enable_thinking": "false"}},
        "chat_template_kwargs.enable_thinking",
        "expected a boolean (true or false), got string 'false'",
    ),
    ({"chat_template_kwargs": {"enable_thinking": 0}}, "chat_template_kwargs.enable_thinking", "got number 0"),
]


@pytest.mark.parametrize(("body", "param", "fragment"), ERRORS, ids=[f"{e[1]}-{i}" for i, e in enumerate(ERRORS)])
def test_bad_request_names_the_field(body, param, fragment):
    with pytest.raises(RequestError) as info:
        parse(body)
    assert info.value.param == param
    assert fragment in info.value.message
    assert isinstance(info.value, ValueError)


def test_schema_depth_bound_is_exact():
    # Each object level is two containers (the schema and its "properties"); the leaf is one more.
    fits = (MAX_SCHEMA_DEPTH - 1) // 2
    parse({"tools": [tool(parameters=nested_schema(fits))]})
    with pytest.raises(RequestError, match="nested too deeply"):
        parse({"tools": [tool(parameters=nested_schema(fits + 1))]})


def test_realistic_deep_schema_is_accepted():
    # OpenAI's structured outputs allow 10 object levels; with anyOf in between that must still pass.
    schema = {"type": "string"}
    for _ in range(10):
        schema = {"type": "object", "properties": {"x": {"anyOf": [schema, {"type": "null"}]}}, "required": ["x"]}
    out = parse(
        {
            "tools": [tool(parameters=schema)],
            "response_format": {"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}},
        }
    )
    assert out.tools[0]["function"]["parameters"] == schema
    assert out.json_schema == schema


# ---------------------------------------------------------------- normalisation


def test_defaults_without_tools():
    assert parse({}) == ConstraintRequest(tool_choice="none")
    out = parse({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2, "n": 1})
    assert out == ConstraintRequest(tool_choice="none")
    assert out.tools == () and out.allowed_tools == () and out.named_tool is None
    assert out.parallel_tool_calls is True and out.response_format == "text" and out.json_schema is None
    assert out.allow_reasoning is True and out.reasoning_effort is None and out.chat_template_kwargs == {}
    assert out.callable_tools == ()


def test_tool_normal_form():
    body = {
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Weather.",
                    "strict": True,
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                        "additionalProperties": False,
                    },
                },
            },
            {"function": {"name": "ping-2"}},  # type may be left out (vLLM does the same)
            {"type": "function", "function": {"name": "noop", "description": None, "parameters": None, "strict": None}},
            {"type": "function", "function": {"name": "free", "parameters": {"properties": {"q": {}}}}},
        ]
    }
    out = parse(body)
    assert out.tools == (
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather.",
                "strict": True,
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                    "additionalProperties": False,
                },
            },
        },
        {
            "type": "function",
            "function": {"name": "ping-2", "description": "", "parameters": EMPTY_PARAMS, "strict": False},
        },
        {
            "type": "function",
            "function": {"name": "noop", "description": "", "parameters": EMPTY_PARAMS, "strict": False},
        },
        {
            "type": "function",
            "function": {"name": "free", "description": "", "parameters": {"properties": {"q": {}}}, "strict": False},
        },
    )
    assert out.tool_names == ("get_weather", "ping-2", "noop", "free")
    assert out.tool_choice == "auto" and out.allowed_tools == out.tool_names and out.named_tool is None
    assert [list(t) for t in out.tools] == [["type", "function"]] * 4
    assert all(list(t["function"]) == ["name", "description", "parameters", "strict"] for t in out.tools)


def test_bounds_are_the_callers():
    many = {"tools": tools(*(f"f{i}" for i in range(MAX_TOOLS + 1)))}
    assert len(chat_constraint_request_from_openai(many).tools) == MAX_TOOLS + 1  # no bound of its own
    assert len(chat_constraint_request_from_openai(many, max_tools=500).tools) == MAX_TOOLS + 1
    with pytest.raises(RequestError, match="at most 3 tools"):
        chat_constraint_request_from_openai({"tools": tools("a", "b", "c", "d")}, max_tools=3)
    deep = {"tools": [tool(parameters=nested_schema(5000))]}  # past Python's recursion limit
    with pytest.raises(RequestError, match="nested too deeply") as info:
        chat_constraint_request_from_openai(deep)
    assert info.value.param == "tools[0].function.parameters"


def test_max_tools_and_name_edges_are_accepted():
    names = [f"f_{i}" for i in range(MAX_TOOLS - 2)] + ["x" * 64, "A-b_9"]
    assert parse({"tools": tools(*names)}).tool_names == tuple(names)


def test_schemas_are_copied_not_aliased():
    params = {"type": "object", "properties": {"a": {"type": "string", "default": None, "enum": [None, "x"]}}}
    body = {
        "tools": [tool("f", parameters=params)],
        "chat_template_kwargs": {"custom": {"k": [1]}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": params}},
    }
    before = copy.deepcopy(body)
    out = parse(body)
    assert body == before
    params["properties"]["a"]["type"] = "integer"
    body["chat_template_kwargs"]["custom"]["k"].append(2)
    assert out.tools[0]["function"]["parameters"]["properties"]["a"] == {
        "type": "string",
        "default": None,
        "enum": [None, "x"],
    }  # nulls inside a schema are kept
    assert out.json_schema["properties"]["a"]["type"] == "string"
    assert out.chat_template_kwargs == {"custom": {"k": [1]}}


# (body extras, tool_choice, allowed_tools, named_tool)
TOOL_CHOICES = [
    ({}, "auto", ("a", "b", "c"), None),
    ({"tool_choice": None}, "auto", ("a", "b", "c"), None),
    ({"tool_choice": "auto"}, "auto", ("a", "b", "c"), None),
    ({"tool_choice": "none"}, "none", (), None),
    ({"tool_choice": "required"}, "required", ("a", "b", "c"), None),
    ({"tool_choice": named("b")}, "required", ("b",), "b"),
    ({"tool_choice": {"function": {"name": "b"}}}, "required", ("b",), "b"),  # type left out
    ({"tool_choice": {"type": "function", "name": "c"}}, "required", ("c",), "c"),  # Responses-style flat form
    ({"tool_choice": {"type": "function", "function": {"name": "b", "extra": 1}, "x": 2}}, "required", ("b",), "b"),
    ({"tool_choice": allowed("auto", "c", "a")}, "auto", ("c", "a"), None),
    ({"tool_choice": allowed("required", "b")}, "required", ("b",), None),
    ({"tool_choice": allowed("required", "a", "b", "a")}, "required", ("a", "b"), None),
    (
        {"tool_choice": {"allowed_tools": {"mode": "auto", "tools": [{"type": "function", "name": "a"}]}}},
        "auto",
        ("a",),
        None,
    ),
]


@pytest.mark.parametrize(("extra", "choice", "allowed_names", "named_tool"), TOOL_CHOICES)
def test_tool_choice_normal_form(extra, choice, allowed_names, named_tool):
    out = parse({"tools": tools("a", "b", "c"), **extra})
    assert (out.tool_choice, out.allowed_tools, out.named_tool) == (choice, allowed_names, named_tool)
    assert out.tool_names == ("a", "b", "c")  # tools stay declared even when narrowed or "none"
    expected_callable = () if choice == "none" else tuple(n for n in ("a", "b", "c") if n in allowed_names)
    assert tuple(t["function"]["name"] for t in out.callable_tools) == expected_callable


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"tool_choice": "auto"},
        {"tool_choice": "none"},
        {"tools": [], "tool_choice": "auto"},
        {"tools": None, "tool_choice": None},
        {"tools": []},
    ],
)
def test_no_tools_means_none(body):
    out = parse(body)
    assert (out.tool_choice, out.allowed_tools, out.named_tool, out.tools) == ("none", (), None, ())


@pytest.mark.parametrize(("value", "expected"), [(None, True), (True, True), (False, False)])
def test_parallel_tool_calls(value, expected):
    assert parse({"tools": TWO, "parallel_tool_calls": value}).parallel_tool_calls is expected


RESPONSE_FORMATS = [
    (None, ("text", None, None, False, None)),
    ({"type": "text"}, ("text", None, None, False, None)),
    ({"type": "json_object"}, ("json_object", None, None, False, None)),
    ({"type": "json_object", "schema": {"type": "object"}}, ("json_object", None, None, False, None)),
    ({"type": "json_schema", "json_schema": {"name": "r"}}, ("json_schema", {}, "r", False, None)),
    (
        {"type": "json_schema", "json_schema": {"name": "r", "schema": None, "strict": None, "description": None}},
        ("json_schema", {}, "r", False, None),
    ),
    (
        {
            "type": "json_schema",
            "json_schema": {
                "name": "Person_1",
                "description": "a person",
                "strict": True,
                "schema": {"type": "array", "items": {"type": "integer"}},
            },
        },
        ("json_schema", {"type": "array", "items": {"type": "integer"}}, "Person_1", True, "a person"),
    ),
]


@pytest.mark.parametrize(("response_format", "expected"), RESPONSE_FORMATS)
def test_response_format_normal_form(response_format, expected):
    out = parse({"response_format": response_format})
    got = (
        out.response_format,
        out.json_schema,
        out.json_schema_name,
        out.json_schema_strict,
        out.json_schema_description,
    )
    assert got == expected


# (body, allow_reasoning, reasoning_effort)
THINKING = [
    ({}, True, None),
    ({"think": True}, True, None),
    ({"think": False}, False, None),
    ({"think": None}, True, None),
    ({"reasoning_effort": "none"}, False, None),
    ({"reasoning_effort": None}, True, None),
    *[({"reasoning_effort": e}, True, e) for e in ("minimal", "low", "medium", "high", "xhigh", "max")],
    ({"chat_template_kwargs": {"enable_thinking": False}}, False, None),
    ({"chat_template_kwargs": {"enable_thinking": True}}, True, None),
    ({"chat_template_kwargs": {"enable_thinking": None}}, True, None),
    ({"chat_template_kwargs": None}, True, None),
    ({"think": True, "reasoning_effort": "high"}, True, "high"),
    ({"think": False, "reasoning_effort": "high"}, False, None),
    ({"think": True, "reasoning_effort": "none"}, False, None),
    ({"think": True, "chat_template_kwargs": {"enable_thinking": False}}, False, None),
    ({"think": False, "chat_template_kwargs": {"enable_thinking": True}}, False, None),
    ({"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": True}}, True, "low"),
    ({"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": False}}, False, None),
    ({"think": None, "reasoning_effort": None, "chat_template_kwargs": {"enable_thinking": None}}, True, None),
]


@pytest.mark.parametrize(("body", "allow", "effort"), THINKING)
def test_thinking_switch(body, allow, effort):
    out = parse(body)
    assert (out.allow_reasoning, out.reasoning_effort) == (allow, effort)


def test_chat_template_kwargs_copy_drops_nulls():
    out = parse({"chat_template_kwargs": {"enable_thinking": False, "custom": "x", "gone": None}})
    assert out.chat_template_kwargs == {"enable_thinking": False, "custom": "x"}


NULLABLE = [
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "think",
    "reasoning_effort",
    "chat_template_kwargs",
]


@pytest.mark.parametrize("name", NULLABLE)
def test_top_level_null_reads_as_missing(name):
    base = {
        "tools": TWO,
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "think": False,
        "response_format": {"type": "json_object"},
        "reasoning_effort": "none",
        "chat_template_kwargs": {"enable_thinking": False},
    }
    if name == "tools":
        base.pop("tool_choice")
    with_null = {**base, name: None}
    without = {k: v for k, v in base.items() if k != name}
    assert parse(with_null) == parse(without)


def test_nested_nulls_read_as_missing():
    with_nulls = {
        "tools": [{"type": None, "function": {"name": "a", "description": None, "parameters": None, "strict": None}}],
        "tool_choice": {"type": None, "function": {"name": "a"}},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "r", "schema": None, "strict": None, "description": None},
        },
        "chat_template_kwargs": {"enable_thinking": None},
    }
    without = {
        "tools": [{"function": {"name": "a"}}],
        "tool_choice": {"function": {"name": "a"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "r"}},
    }
    assert parse(with_nulls) == parse(without)


def test_result_is_frozen():
    out = parse({"tools": TWO})
    with pytest.raises(AttributeError):
        out.tool_choice = "none"  # type: ignore[misc]


# ---------------------------------------------------------------- the normal form is a fixed point

NORMAL_TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name", "description", "parameters", "strict"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                "description": {"type": "string"},
                "parameters": {"type": "object"},
                "strict": {"type": "boolean"},
            },
        },
    },
}


def _check_normal_form(out: ConstraintRequest):
    for t in out.tools:
        jsonschema.validate(t, NORMAL_TOOL)
        jsonschema.Draft202012Validator.check_schema(t["function"]["parameters"])
    assert out.tool_choice in ("none", "auto", "required")
    assert set(out.allowed_tools) <= set(out.tool_names)
    assert (out.tool_choice == "none") == (not out.allowed_tools)
    assert out.named_tool is None or out.allowed_tools == (out.named_tool,)
    assert out.response_format in ("text", "json_object", "json_schema")
    assert (out.json_schema is not None) == (out.response_format == "json_schema")
    assert out.allow_reasoning or out.reasoning_effort is None


names_st = st.sampled_from(["a", "b", "get_weather", "x-1", "bad name", "", 3, None])
json_leaf = st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=4)
json_any = st.recursive(
    json_leaf, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=8
)
schema_st = (
    st.none()
    | json_any
    | st.fixed_dictionaries(
        {"type": st.sampled_from(["object", "string"])},
        optional={
            "properties": st.dictionaries(st.sampled_from("pq"), st.just({"type": "integer"})) | json_any,
            "required": st.lists(st.sampled_from("pq"), max_size=2) | json_any,
        },
    )
)
function_st = st.fixed_dictionaries(
    {"name": names_st},
    optional={
        "description": st.none() | st.text(max_size=5) | st.integers(),
        "parameters": schema_st,
        "strict": st.none() | st.booleans() | st.integers(0, 1),
    },
)
tool_st = (
    st.fixed_dictionaries(
        {"function": function_st | json_any}, optional={"type": st.sampled_from(["function", "custom", None])}
    )
    | json_leaf
)
ref_st = st.builds(named, names_st) | st.fixed_dictionaries({"type": st.just("function"), "name": names_st}) | json_any
choice_st = (
    st.sampled_from(["none", "auto", "required", "any", None])
    | st.builds(named, names_st)
    | st.fixed_dictionaries(
        {
            "type": st.sampled_from(["allowed_tools", "function", None]),
            "allowed_tools": st.fixed_dictionaries(
                {
                    "mode": st.sampled_from(["auto", "required", "none"]),
                    "tools": st.lists(ref_st, max_size=3) | json_any,
                }
            ),
        }
    )
    | json_any
)
body_st = st.fixed_dictionaries(
    {},
    optional={
        "tools": st.lists(tool_st, max_size=4) | json_any,
        "tool_choice": choice_st,
        "parallel_tool_calls": st.none() | st.booleans() | json_leaf,
        "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}, None])
        | st.fixed_dictionaries(
            {
                "type": st.just("json_schema"),
                "json_schema": st.fixed_dictionaries(
                    {"name": names_st}, optional={"schema": schema_st, "strict": st.none() | st.booleans()}
                ),
            }
        )
        | json_any,
        "think": st.none() | st.booleans() | json_leaf,
        "reasoning_effort": st.sampled_from(["none", "low", "high", "huge", None, 1]),
        "chat_template_kwargs": st.none()
        | st.fixed_dictionaries({}, optional={"enable_thinking": st.none() | st.booleans() | json_leaf, "x": json_any})
        | json_any,
    },
)


@settings(max_examples=300, deadline=None)
@given(body_st)
def test_fuzz_either_normal_form_or_request_error(body):
    try:
        out = parse(body)
    except RequestError as e:
        assert e.param is None or isinstance(e.param, str)
        assert isinstance(e.message, str) and e.message
        return
    _check_normal_form(out)
    # Feeding the normal form back in (narrowing expressed as allowed_tools) reproduces it.
    if out.named_tool:
        choice = named(out.named_tool)
    elif out.tool_choice == "none":
        choice = "none"
    else:
        choice = {
            "type": "allowed_tools",
            "allowed_tools": {"mode": out.tool_choice, "tools": [named(n) for n in out.allowed_tools]},
        }
    again = parse({"tools": list(out.tools), "tool_choice": choice})
    assert (again.tools, again.tool_choice, again.allowed_tools, again.named_tool) == (
        out.tools,
        out.tool_choice,
        out.allowed_tools,
        out.named_tool,
    )


# ---------------------------------------------------------------- shapes the official SDK sends

openai = pytest.importorskip("openai")


def _sdk_type(module: str, name: str):
    mod = pytest.importorskip(module)
    if not hasattr(mod, name):
        pytest.skip(f"{module}.{name} is not in openai {openai.__version__}")
    return getattr(mod, name)


def test_sdk_tool_and_named_choice():
    tool_param = _sdk_type("openai.types.chat", "ChatCompletionToolParam")
    named_param = _sdk_type("openai.types.chat", "ChatCompletionNamedToolChoiceParam")
    definition = _sdk_type("openai.types.shared_params", "FunctionDefinition")
    fn = definition(
        name="get_weather",
        description="Current weather.",
        strict=True,
        parameters={
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    )
    body = {
        "tools": [
            tool_param(type="function", function=fn),
            tool_param(type="function", function=definition(name="get_time")),
        ],
        "tool_choice": named_param(type="function", function={"name": "get_time"}),
        "parallel_tool_calls": False,
    }
    out = parse(body)
    assert out.tool_names == ("get_weather", "get_time")
    assert out.tools[0]["function"]["strict"] is True
    assert out.tools[1]["function"]["parameters"] == EMPTY_PARAMS
    assert (out.tool_choice, out.allowed_tools, out.named_tool, out.parallel_tool_calls) == (
        "required",
        ("get_time",),
        "get_time",
        False,
    )


def test_sdk_allowed_tools_choice():
    choice_param = _sdk_type("openai.types.chat", "ChatCompletionAllowedToolChoiceParam")
    tools_param = _sdk_type("openai.types.chat", "ChatCompletionAllowedToolsParam")
    choice = choice_param(
        type="allowed_tools",
        allowed_tools=tools_param(mode="required", tools=[{"type": "function", "function": {"name": "b"}}]),
    )
    out = parse({"tools": TWO, "tool_choice": choice})
    assert (out.tool_choice, out.allowed_tools, out.named_tool) == ("required", ("b",), None)


def test_sdk_tool_choice_literals():
    from typing import get_args

    option = _sdk_type("openai.types.chat", "ChatCompletionToolChoiceOptionParam")
    literals = [a for arg in get_args(option) for a in get_args(arg) if isinstance(a, str)]
    assert set(literals) == {"none", "auto", "required"}
    for lit in literals:
        assert parse({"tools": TWO, "tool_choice": lit}).tool_choice == lit


def test_sdk_response_formats():
    text = _sdk_type("openai.types.shared_params", "ResponseFormatText")
    obj = _sdk_type("openai.types.shared_params", "ResponseFormatJSONObject")
    schema_fmt = _sdk_type("openai.types.shared_params", "ResponseFormatJSONSchema")
    assert parse({"response_format": text(type="text")}).response_format == "text"
    assert parse({"response_format": obj(type="json_object")}).response_format == "json_object"
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    out = parse(
        {
            "response_format": schema_fmt(
                type="json_schema",
                json_schema={"name": "count", "description": "A count.", "schema": schema, "strict": True},
            )
        }
    )
    assert (
        out.response_format,
        out.json_schema,
        out.json_schema_name,
        out.json_schema_strict,
        out.json_schema_description,
    ) == ("json_schema", schema, "count", True, "A count.")


def test_sdk_pydantic_response_format():
    """`client.chat.completions.parse(response_format=Model)` sends `type_to_response_format_param(Model)`."""
    pydantic = pytest.importorskip("pydantic")
    helper = pytest.importorskip("openai.lib._parsing._completions")
    if not hasattr(helper, "type_to_response_format_param"):
        pytest.skip("type_to_response_format_param is not in this openai version")

    class Step(pydantic.BaseModel):
        explanation: str
        output: str

    class Answer(pydantic.BaseModel):
        steps: list[Step]
        final_answer: str

    fmt = helper.type_to_response_format_param(Answer)
    out = parse({"response_format": fmt})
    assert out.response_format == "json_schema" and out.json_schema_name == "Answer" and out.json_schema_strict
    jsonschema.Draft202012Validator.check_schema(out.json_schema)
    jsonschema.validate({"steps": [{"explanation": "e", "output": "o"}], "final_answer": "f"}, out.json_schema)


def test_sdk_pydantic_function_tool():
    """`openai.pydantic_function_tool(Model)` builds the strict tool shape the SDK sends."""
    pydantic = pytest.importorskip("pydantic")
    if not hasattr(openai, "pydantic_function_tool"):
        pytest.skip("pydantic_function_tool is not in this openai version")

    class GetWeather(pydantic.BaseModel):
        city: str
        unit: str | None = None

    out = parse({"tools": [openai.pydantic_function_tool(GetWeather)], "tool_choice": "required"})
    fn = out.tools[0]["function"]
    assert fn["name"] == "GetWeather" and fn["strict"] is True and fn["parameters"]["type"] == "object"
    jsonschema.Draft202012Validator.check_schema(fn["parameters"])


def test_sdk_reasoning_effort_values_are_accepted():
    from typing import get_args

    effort = _sdk_type("openai.types.shared", "ReasoningEffort")
    values = [a for arg in get_args(effort) for a in get_args(arg) if isinstance(a, str)]
    assert "none" in values and "high" in values
    for value in values:
        out = parse({"reasoning_effort": value})
        assert out.allow_reasoning is (value != "none")
        assert out.reasoning_effort == (None if value == "none" else value)


def test_sdk_create_params_typed_dict():
    params = _sdk_type("openai.types.chat.completion_create_params", "CompletionCreateParamsNonStreaming")
    body = params(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}],
        tool_choice={"type": "function", "function": {"name": "a"}},
        response_format={"type": "json_object"},
        reasoning_effort="low",
        parallel_tool_calls=True,
    )
    out = parse(dict(body))
    assert (out.named_tool, out.response_format, out.reasoning_effort) == ("a", "json_object", "low")


def _posted_bodies(call):
    """Run `call(client)` against an in-memory transport; return the JSON bodies the SDK posted."""
    import json

    httpx = pytest.importorskip("httpx")
    posted = []
    reply = {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": '{"n": 1}'}}],
    }

    def handler(request):
        posted.append(json.loads(request.content))
        return httpx.Response(200, json=reply)

    client = openai.OpenAI(
        api_key="k",
        base_url="http://jaxchat.invalid/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    call(client)
    return posted


def test_sdk_client_posts_accepted_bodies():
    """The JSON the real client posts for each constraint form parses to the expected normal form."""
    pydantic = pytest.importorskip("pydantic")

    class Count(pydantic.BaseModel):
        n: int

    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
    msgs = [{"role": "user", "content": "hi"}]
    create = {"model": "m", "messages": msgs, "tools": [weather]}
    bodies = _posted_bodies(
        lambda c: [
            c.chat.completions.create(**create),
            c.chat.completions.create(**create, tool_choice="required", parallel_tool_calls=False),
            c.chat.completions.create(**create, tool_choice={"type": "function", "function": {"name": "get_weather"}}),
            c.chat.completions.create(
                **create,
                tool_choice={
                    "type": "allowed_tools",
                    "allowed_tools": {
                        "mode": "auto",
                        "tools": [{"type": "function", "function": {"name": "get_weather"}}],
                    },
                },
            ),
            c.chat.completions.create(
                model="m", messages=msgs, response_format={"type": "json_object"}, reasoning_effort="none"
            ),
            c.chat.completions.create(
                model="m", messages=msgs, extra_body={"chat_template_kwargs": {"enable_thinking": False}, "think": None}
            ),
            c.chat.completions.parse(model="m", messages=msgs, response_format=Count),
        ]
    )
    got = [parse(b) for b in bodies]
    assert [(o.tool_choice, o.allowed_tools, o.named_tool) for o in got[:4]] == [
        ("auto", ("get_weather",), None),
        ("required", ("get_weather",), None),
        ("required", ("get_weather",), "get_weather"),
        ("auto", ("get_weather",), None),
    ]
    assert got[1].parallel_tool_calls is False
    assert (got[4].response_format, got[4].allow_reasoning, got[4].tool_choice) == ("json_object", False, "none")
    assert (got[5].allow_reasoning, got[5].chat_template_kwargs) == (False, {"enable_thinking": False})
    assert (got[6].response_format, got[6].json_schema_name, got[6].json_schema_strict) == (
        "json_schema",
        "Count",
        True,
    )
    assert got[6].json_schema["properties"]["n"]["type"] == "integer"


# ---------------------------------------------------------------- import rule


def test_request_modules_import_without_heavy_deps():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('jax', 'jaxlib', 'numpy', 'xgrammar', 'starlette', 'jsonschema'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import jaxchat.chat.request_tools, jaxchat.chat.request as r\n"
        "print(r.chat_constraint_request_from_openai({}).tool_choice)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "none"
