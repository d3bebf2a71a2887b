"""The structural-tag format of an `OutputConstraint` (regex, choice, grammar) and xgrammar's errors as messages.

Contract: `output_format(output)` returns the xgrammar structural-tag format that admits exactly the texts
`output` allows: `{"type": "regex", "pattern"}` for a regex, `{"type": "grammar", "grammar"}` for an EBNF
(GBNF, its `.` rewritten: `gbnf_to_ebnf`) grammar and for a choice (an alternation of the strings as EBNF string literals, `choice_grammar`),
None for a JSON schema (the caller builds JSON as for `response_format`). `compiler_message(exc)` is
xgrammar's error text without its timestamp and source-file prefix, the message a 400 carries.
"""

from __future__ import annotations

import re

from jaxchat.chat.structured import OutputConstraint

__all__ = ["choice_grammar", "compiler_message", "gbnf_to_ebnf", "literal", "output_format"]

_XGR_PREFIX = re.compile(r"^\[[0-9:]+\] \S+?:\d+: ")


def literal(text: str) -> str:
    """`text` as an EBNF string literal: quotes, backslashes and control characters escaped."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def choice_grammar(choices) -> str:
    """An EBNF grammar whose language is exactly `choices`."""
    return "root ::= " + " | ".join(literal(c) for c in choices)


def output_format(output: OutputConstraint) -> dict | None:
    if output.kind == "regex":
        return {"type": "regex", "pattern": output.text}
    if output.kind == "grammar":
        return {"type": "grammar", "grammar": gbnf_to_ebnf(output.text)}
    if output.kind == "choice":
        return {"type": "grammar", "grammar": choice_grammar(output.choices)}
    return None


_GBNF_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|#[^\n]*|\.')


def gbnf_to_ebnf(grammar: str) -> str:
    """llama.cpp's GBNF in xgrammar's EBNF: the one construct xgrammar lacks, `.` (any character) outside string
    literals, character classes and comments, becomes the class of every character."""
    return _GBNF_TOKEN.sub(lambda m: "[\\u0000-\\U0010ffff]" if m.group() == "." else m.group(), grammar)


def compiler_message(exc: BaseException) -> str:
    """xgrammar's message for `exc`, without its log prefix."""
    return _XGR_PREFIX.sub("", str(exc).strip())
