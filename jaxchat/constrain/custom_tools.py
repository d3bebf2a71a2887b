"""OpenAI custom tools in the grammar: the input of a call constrained by the tool's Lark or regex grammar.

Contract: a custom tool is normalised by `jaxchat.chat.request_tools` into a function tool whose one string
parameter `input` carries the input (`custom_format(tool)` gives its syntax and definition). In the JSON-call
formats the call's arguments are exactly `{"input": "<the input, JSON-escaped>"}`, so
`custom_arguments(tool)` returns the structural-tag format of those arguments: for `text`, None (the plain
string schema does it); for `lark` / `regex`, a grammar whose input part is the tool's grammar in its JSON-string
form (`json_escape`). `input_ebnf(syntax, definition)` is the tool's grammar over the raw input (cached by
content); `check_custom_tools(tools)` raises `RequestError` naming `tools[i].custom.format.grammar.definition`
when one cannot be converted or compiled (the compiler's or converter's message).
"""

from __future__ import annotations

import functools

import xgrammar as xgr

from jaxchat.chat import RequestError
from jaxchat.chat.request_tools import custom_format
from jaxchat.constrain.json_escape import json_string_ebnf
from jaxchat.constrain.lark_ebnf import LarkError, lark_to_ebnf
from jaxchat.constrain.output import compiler_message

__all__ = ["check_custom_tools", "custom_arguments", "input_ebnf"]

_OPEN = '"{\\"input\\": \\""'
_CLOSE = '"\\"}"'


@functools.lru_cache(maxsize=256)
def input_ebnf(syntax: str, definition: str) -> str:
    """The EBNF (root `root`) of a custom tool's raw input; LarkError / RuntimeError when it has none."""
    if syntax == "lark":
        return lark_to_ebnf(definition)
    return str(xgr.Grammar.from_regex(definition))


@functools.lru_cache(maxsize=256)
def _arguments_grammar(syntax: str, definition: str) -> str:
    inner = json_string_ebnf(input_ebnf(syntax, definition), "input")
    grammar = f"root ::= {_OPEN} input {_CLOSE}\n{inner}"
    xgr.Grammar.from_ebnf(grammar)  # raises where the rewritten grammar does not read
    return grammar


def custom_arguments(tool: dict) -> dict | None:
    """The arguments format of a custom tool with a grammar (None for a function tool or a `text` input)."""
    fmt = custom_format(tool)
    if fmt is None or fmt[0] == "text":
        return None
    return {"type": "grammar", "grammar": _arguments_grammar(*fmt)}


def check_custom_tools(tools) -> None:
    for i, tool in enumerate(tools):
        fmt = custom_format(tool)
        if fmt is None or fmt[0] == "text":
            continue
        param = f"tools[{i}].custom.format.grammar.definition"
        try:
            _arguments_grammar(*fmt)
        except LarkError as exc:
            raise RequestError(param, str(exc)) from None
        except (RuntimeError, ValueError) as exc:
            raise RequestError(param, f"the {fmt[0]} grammar cannot be used: {compiler_message(exc)}") from None
