"""A Lark grammar (OpenAI custom tools' `syntax: "lark"`) as an xgrammar EBNF grammar over the same characters.

Contract: `lark_to_ebnf(definition, start="start") -> str` reads `definition` with the `lark` package (its own
loader: rules, terminals, string and regex literals, `? * + ~`, alternatives, `%import common.X` (ESCAPED_STRING's lookbehind rewritten), `%ignore`,
templates, inlined `_rules` and `?rules`) and writes an EBNF grammar whose `root` is `start`. Terminals become
rules (string literals as EBNF strings, regex literals through xgrammar's regex converter); `%ignore`d terminals
may appear before the first token and after every terminal, as Lark's lexer skips them. The language is the
character-level one: where Lark's lexer would split two adjacent terminals differently (a keyword inside a
name), the EBNF may admit a text Lark's parser refuses. `LarkError(construct, message)` (a ValueError) for a
definition Lark cannot read or a construct with no EBNF equivalent (regex flags such as `i`, lookarounds):
never a silently looser grammar.
"""

from __future__ import annotations

import re

import xgrammar as xgr

from jaxchat.constrain.output import choice_grammar

__all__ = ["LarkError", "lark_to_ebnf"]

_ROOT_RULE = re.compile(r"\broot((?:_\d+)*)\b")
# Lark's common.ESCAPED_STRING ends its string with a lookbehind; the same language without one
_ESCAPED_INNER = (r'".*?(?<!\\)(\\\\)*?"', r'"(?:[^"\\\n]|\\[^\n])*"')
_LAZY = re.compile(r"(?<!\\)([*+?}])\?")  # lazy quantifiers: the same language as greedy ones for a whole match
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # Lark keeps them raw in its regexes; xgrammar wants them escaped


class LarkError(ValueError):
    def __init__(self, construct: str, message: str):
        super().__init__(message)
        self.construct = construct


def _name(kind: str, name: str) -> str:
    return f"{kind}_{re.sub(r'[^A-Za-z0-9_]', '_', name)}"


def _terminal_rules(term) -> list[str]:
    """The EBNF rules of one Lark terminal, the first named `t_<NAME>`."""
    name = _name("t", term.name)
    pattern = term.pattern
    if pattern.flags:
        raise LarkError(term.name, f"terminal {term.name}: regex flags {sorted(pattern.flags)} are not supported")
    if pattern.type == "str":
        return [choice_grammar([pattern.value]).replace("root ::=", f"{name} ::=", 1)]
    try:
        regex = _LAZY.sub(r"\1", pattern.value.replace(*_ESCAPED_INNER))
        printed = str(xgr.Grammar.from_regex(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", regex)))
    except RuntimeError as exc:
        msg = re.sub(r"^\[[0-9:]+\] \S+?:\d+: ", "", str(exc).strip())
        raise LarkError(term.name, f"terminal {term.name}: its regex /{pattern.value}/ cannot be converted: {msg}") from None
    return [_ROOT_RULE.sub(lambda m: name + (m.group(1) or ""), line) for line in printed.strip().splitlines()]


def lark_to_ebnf(definition: str, start: str = "start") -> str:
    from lark import Lark
    from lark.exceptions import GrammarError
    from lark.exceptions import LarkError as LarkPackageError

    try:
        parser = Lark(definition, start=start, parser="earley", lexer="dynamic", keep_all_tokens=True)
    except (GrammarError, LarkPackageError) as exc:
        raise LarkError("definition", f"the Lark grammar is invalid: {exc}".strip()) from None
    ignored = set(parser.ignore_tokens)
    ign = " ign" if ignored else ""
    lines = [f"root ::={ign} {_name('r', start)}"]
    alternatives: dict[str, list[str]] = {}
    for rule in parser.rules:
        symbols = []
        for sym in rule.expansion:
            symbols.append(_name("t", sym.name) + ign if sym.is_term else _name("r", sym.name))
        alternatives.setdefault(_name("r", rule.origin.name), []).append(" ".join(symbols) or '""')
    for origin, alts in alternatives.items():
        lines.append(f"{origin} ::= " + " | ".join(f"({a})" for a in alts))
    used = {s.name for rule in parser.rules for s in rule.expansion if s.is_term} | ignored
    for term in parser.terminals:
        if term.name in used:
            lines += _terminal_rules(term)
    if ignored:
        lines.append("ign ::= (" + " | ".join(_name("t", t) for t in sorted(ignored)) + ")*")
    return "\n".join(lines) + "\n"
