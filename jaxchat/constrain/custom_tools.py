"""OpenAI custom tools in the grammar: the input of a call constrained by the tool's Lark or regex grammar.

Contract: a custom tool is normalised by `jaxchat.chat.request_tools` into a function tool whose one string
parameter `input` carries the input (`custom_format(tool)` gives its syntax and definition). How the arguments
carry the input, per argument `style`:

| style      | formats                                    | the call's arguments                              |
| ---------- | ------------------------------------------ | ------------------------------------------------- |
| `json`     | hermes_json, llama3_json, mistral, deepseek_v3, harmony | `{"input": "<the input, JSON-escaped>"}` |
| `qwen_xml` | qwen_xml (raw-text parameters)             | `<parameter=input>\\n<the raw input>\\n</parameter>\\n` |
| `gemma`    | gemma4 (verbatim Gemma strings)            | `{input:` Gemma's string quote, the raw input, the quote `}` |
| `python`   | lfm2 (Python calls)                        | `input="<the input, JSON-escaped>"` (a valid Python string literal of it) |

`custom_arguments(tool, style)` returns the structural-tag format of those arguments for the first three: for a
`text` input or a function tool, None (the plain string schema does it); for `lark` / `regex`, a grammar whose
input part is the tool's grammar, raw or in its JSON-string form (`json_escape`). `python_arguments(tool, prefix)`
returns, for LFM2's one call-list grammar (`jaxchat.constrain.pyargs.python_calls_grammar`), `(rule, rules)`: EBNF
rules, every name prefixed with `prefix`, whose rule `rule` spells the arguments; None likewise.
`input_ebnf(syntax, definition)` is the tool's grammar over the raw input (cached by content);
`check_custom_tools(tools)` raises `RequestError` naming `tools[i].custom.format.grammar.definition`
when one cannot be converted or compiled (the compiler's or converter's message). A raw input that spells the
format's own delimiter (`</parameter>`, `<|"|>`) would end the parameter early: the grammars do not exclude it.
"""

from __future__ import annotations

import functools

import xgrammar as xgr

from jaxchat.chat import RequestError
from jaxchat.chat.request_tools import custom_format
from jaxchat.constrain.ebnf_text import grammar_rules, rename_references
from jaxchat.constrain.json_escape import json_string_ebnf
from jaxchat.constrain.lark_ebnf import LarkError, lark_to_ebnf
from jaxchat.constrain.output import compiler_message

__all__ = ["check_custom_tools", "custom_arguments", "input_ebnf", "python_arguments"]

@functools.lru_cache(maxsize=256)
def input_ebnf(syntax: str, definition: str) -> str:
    """The EBNF (root `root`) of a custom tool's raw input; LarkError / RuntimeError when it has none."""
    if syntax == "lark":
        return lark_to_ebnf(definition)
    return str(xgr.Grammar.from_regex(definition))


def _renamed(ebnf: str, rename) -> str:
    """`ebnf` with every rule name `n` written `rename(n)` (names inside literals and classes left alone)."""
    rules = grammar_rules(ebnf)
    mapping = {name: rename(name) for name in rules}
    return "\n".join(f"{mapping[name]} ::= {rename_references(body, mapping)}" for name, body in rules.items())


def _as_input(ebnf: str) -> str:
    """`ebnf` with its root named `input` and its other rules `input_<name>`, to sit beside a new root."""
    return _renamed(ebnf, lambda name: "input" if name == "root" else f"input_{name}")


_WRAPS = {  # style -> the arguments around the input
    "json": ('"{\\"input\\": \\""', '"\\"}"'),
    "qwen_xml": ('"<parameter=input>\\n"', '"\\n</parameter>\\n"'),  # as xgrammar's qwen_xml style lays it out
    "gemma": ('"{input:<|\\"|>"', '"<|\\"|>}"'),
}


@functools.lru_cache(maxsize=256)
def _arguments_grammar(syntax: str, definition: str, style: str = "json") -> str:
    raw = input_ebnf(syntax, definition)
    inner = json_string_ebnf(raw, "input") if style == "json" else _as_input(raw)
    open_, close = _WRAPS[style]
    grammar = f"root ::= {open_} input {close}\n{inner}"
    xgr.Grammar.from_ebnf(grammar)  # raises where the rewritten grammar does not read
    return grammar


def custom_arguments(tool: dict, style: str = "json") -> dict | None:
    """The arguments format of a custom tool with a grammar (None for a function tool or a `text` input), in
    the argument `style` "json", "qwen_xml" or "gemma"."""
    fmt = custom_format(tool)
    if fmt is None or fmt[0] == "text":
        return None
    return {"type": "grammar", "grammar": _arguments_grammar(*fmt, style)}


@functools.lru_cache(maxsize=256)
def _python_arguments(syntax: str, definition: str, prefix: str) -> tuple[str, str]:
    inner = _renamed(json_string_ebnf(input_ebnf(syntax, definition), "input"), lambda name: prefix + name)
    rule = f"{prefix}args"
    return rule, f'{rule} ::= "input=\\"" {prefix}input "\\""\n{inner}'


def python_arguments(tool: dict, prefix: str) -> tuple[str, str] | None:
    """(rule, EBNF rules) of a custom tool's LFM2 arguments `input="..."`, names prefixed with `prefix`; None for a
    function tool or a `text` input."""
    fmt = custom_format(tool)
    if fmt is None or fmt[0] == "text":
        return None
    return _python_arguments(*fmt, prefix)


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
