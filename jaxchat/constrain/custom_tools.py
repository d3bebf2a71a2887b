"""OpenAI custom tools in the grammar: the input of a call constrained by the tool's Lark or regex grammar.

Contract: a custom tool is normalised by `jaxchat.chat.request_tools` into a function tool whose one string
parameter `input` carries the input (`custom_format(tool)` gives its syntax and definition). In the JSON-call
formats the call's arguments are exactly `{"input": "<the input, JSON-escaped>"}`; in qwen_xml, whose
parameters are raw text, `<parameter=input>\n<the input>\n</parameter>\n`. `custom_arguments(tool, style)`
returns the structural-tag format of those arguments: for `text`, None (the plain
string schema does it); for `lark` / `regex`, a grammar whose input part is the tool's grammar in its JSON-string
form (`json_escape`). `input_ebnf(syntax, definition)` is the tool's grammar over the raw input (cached by
content); `check_custom_tools(tools)` raises `RequestError` naming `tools[i].custom.format.grammar.definition`
when one cannot be converted or compiled (the compiler's or converter's message).
"""

from __future__ import annotations

import functools
import re

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
def _arguments_grammar(syntax: str, definition: str, style: str = "json") -> str:
    raw = input_ebnf(syntax, definition)
    if style == "qwen_xml":  # the raw input as the one parameter, as xgrammar's qwen_xml style lays it out
        inner = re.sub(r"\broot((?:_\d+)*)\b", r"input\1", raw)
        grammar = f'root ::= "<parameter=input>\\n" input "\\n</parameter>\\n"\n{inner}'
    else:
        grammar = f"root ::= {_OPEN} input {_CLOSE}\n{json_string_ebnf(raw, 'input')}"
    xgr.Grammar.from_ebnf(grammar)  # raises where the rewritten grammar does not read
    return grammar


def custom_arguments(tool: dict, style: str = "json") -> dict | None:
    """The arguments format of a custom tool with a grammar (None for a function tool or a `text` input), in
    the argument `style` "json" (`{"input": "..."}`) or "qwen_xml" (`<parameter=input>` and the raw input)."""
    fmt = custom_format(tool)
    if fmt is None or fmt[0] == "text":
        return None
    return {"type": "grammar", "grammar": _arguments_grammar(*fmt, style)}


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
