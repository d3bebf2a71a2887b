"""Whether a grammar matches no text at all: its root rule has no finite derivation.

Contract: `matches_nothing(grammar) -> bool` takes an `xgrammar.Grammar` (a compiled grammar's `.grammar`) and
reads its serialized form (`Grammar.serialize_json`: rules, and expressions stored as `[type, length, data...]`).
A rule is productive when its body derives some finite text; the productive rules are found by fixpoint: a byte
string, the empty string, a character-class star, a repeat whose minimum is 0 and a tag dispatch (free text) are
productive; a character class is when it holds a character (a negated one when its ranges leave one of
U+0000..U+10FFFF out); a sequence when all its parts are; a choice when one is; a rule reference or a repeat of
a rule when that rule is. True only when the root rule is not productive, e.g. `root ::= "a" root`,
`root ::= "b" [^\\0-\\U0010ffff]` or the regex `a{0}b[^\\s\\S]`, which the first token mask does not reveal (it
allows "a" / "b"). Anything it does not know (another serialization version, a new expression type, a lookahead
assertion, which can only narrow the text) counts as productive, so it never refuses a grammar that matches text.
Pure Python over the JSON; milliseconds for the grammars a request sends; callers cache it with the compiled grammar.
"""

from __future__ import annotations

import json

__all__ = ["matches_nothing"]

_VERSION = "v18"  # the serialization this reads (xgrammar 0.2.x)
_BYTES, _CLASS, _CLASS_STAR, _EMPTY, _RULE_REF, _SEQUENCE, _CHOICES, _TAG_DISPATCH, _REPEAT = range(9)
_MAX_CHAR = 0x10FFFF


def _class_has_char(data: list[int]) -> bool:
    negated, ranges = data[0], sorted(zip(data[1::2], data[2::2]))
    if not negated:
        return any(lo <= hi for lo, hi in ranges)
    covered = -1  # every character up to `covered` is excluded
    for lo, hi in ranges:
        if lo > covered + 1:
            return True
        covered = max(covered, hi)
    return covered < _MAX_CHAR


def matches_nothing(grammar) -> bool:
    try:
        state = json.loads(grammar.serialize_json())
        if state.get("__VERSION__") != _VERSION:
            return False
        data, indptr = state["grammar_expr_data"], state["grammar_expr_indptr"]
        exprs = [data[at:at + 2 + data[at + 1]] for at in indptr]  # `indptr`: where each expression starts
        bodies = [rule[1] for rule in state["rules"]]
        root = state["root_rule_id"]
    except (AttributeError, KeyError, TypeError, ValueError, IndexError):
        return False
    productive = [False] * len(bodies)

    def derives(i: int) -> bool:
        expr = exprs[i]
        kind, args = expr[0], expr[2:]
        if kind in (_BYTES, _CLASS_STAR, _EMPTY, _TAG_DISPATCH):
            return True
        if kind == _CLASS:
            return _class_has_char(args)
        if kind == _RULE_REF:
            return productive[args[0]]
        if kind == _SEQUENCE:
            return all(derives(j) for j in args)
        if kind == _CHOICES:
            return any(derives(j) for j in args)
        if kind == _REPEAT:
            return args[1] == 0 or productive[args[0]]
        return True  # an expression type this does not know

    try:
        changed = True
        while changed:
            changed = False
            for rule, body in enumerate(bodies):
                if not productive[rule] and derives(body):
                    productive[rule] = changed = True
        return not productive[root]
    except (IndexError, TypeError):
        return False
