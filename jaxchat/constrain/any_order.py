"""EBNF for an argument list whose entries may come in any order, each at most once.

Contract: `any_order_rules(fragments, required, lead, sep, prefix)` returns `(start, lines)`: EBNF rule
lines and the name of the rule that matches the fragments (EBNF expressions, one per declared
property: its key and value) in any order, each at most once, every required one present, `lead`
before the first fragment written and `sep` between two. Nothing else is written; with no required
fragment the empty list matches (then not even `lead` is written).

Exact any order needs one grammar state per subset of the fragments already written (2^n): no
context-free grammar for the permutations of n items is smaller than exponential. So the fragments
are cut, in declared order, into consecutive groups of at most `MAX_ANY_ORDER`: any order inside a
group, groups one after the other. Up to `MAX_ANY_ORDER` properties that is exact any order; above
it, a property may not come before one of an earlier group (groups of one are the declared order).
Every state rule holds only rule references, so the compiled grammar's per-position token masks
(xgrammar's compile cost) do not grow with the number of states; the EBNF text does, about
n * 2^(n-1) alternatives per group of n.

Rules (`P` is `prefix`, `g` a group, `m` a bit mask of the group's fragments written so far):
    P{g}e     entering group g, nothing written yet:  `lead` a fragment P{g}_{bit}  | skip the group
    P{g}c     entering group g after other groups:    `sep` a fragment P{g}_{bit}   | skip the group
    P{g}_{m}  inside group g, m written:              `sep` a fragment not in m ...  | leave the group
A group may be skipped or left only once all its required fragments are written; past the last
group (`P{G}e`, `P{G}c`) nothing more is written.
"""

from __future__ import annotations

from collections.abc import Sequence

MAX_ANY_ORDER = 8


def any_order_rules(fragments: Sequence[str], required: Sequence[bool], lead: str, sep: str,
                    prefix: str, group_size: int = MAX_ANY_ORDER) -> tuple[str, list[str]]:
    """(start rule name, EBNF rule lines) for `fragments` in any order within groups of `group_size`."""
    if len(fragments) != len(required):
        raise ValueError("one required flag per fragment")
    if group_size < 1:
        raise ValueError(f"group_size must be at least 1, got {group_size}")
    groups = [range(i, min(i + group_size, len(fragments))) for i in range(0, len(fragments), group_size)]
    lines = [f'{prefix}{len(groups)}e ::= ""', f'{prefix}{len(groups)}c ::= ""']
    for g, members in reversed(list(enumerate(groups))):
        lines.extend(_group_rules(prefix, g, [fragments[i] for i in members], [required[i] for i in members],
                                  lead, sep))
    return f"{prefix}0e", lines


def _group_rules(prefix: str, g: int, fragments: list[str], required: list[bool], lead: str,
                 sep: str) -> list[str]:
    n = len(fragments)
    must = sum(1 << i for i in range(n) if required[i])
    full = (1 << n) - 1

    def after(mask: int) -> str:
        return f"{prefix}{g}_{mask:x}"

    def entry(first: bool) -> str:
        written = lead if first else sep
        alternatives = [_seq(written, fragments[i], after(1 << i)) for i in range(n)]
        if must == 0:
            alternatives.append(f"{prefix}{g + 1}{'e' if first else 'c'}")
        return f"{prefix}{g}{'e' if first else 'c'} ::= " + " | ".join(alternatives)

    lines = [entry(True), entry(False)]
    for mask in range(1, full + 1):
        alternatives = [_seq(sep, fragments[i], after(mask | 1 << i)) for i in range(n) if not mask >> i & 1]
        if mask & must == must:
            alternatives.append(f"{prefix}{g + 1}c")
        lines.append(f"{after(mask)} ::= " + " | ".join(alternatives))
    return lines


def _seq(*parts: str) -> str:
    return " ".join(p for p in parts if p)
