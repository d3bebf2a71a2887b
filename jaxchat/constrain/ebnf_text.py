"""Reusing the rules of a grammar xgrammar printed (`str(xgrammar.Grammar)`) inside an EBNF we write.

Contract:
- `grammar_rules(text)` splits printed EBNF into `{rule name: body}` in order (a body may span
  lines, as xgrammar's `TagDispatch(...)` does).
- `rule_references(body)` and `rename_references(body, mapping)` see rule names only outside string
  literals and character classes, so a schema's enum value that spells a rule name stays intact.
- `RulePool` imports several printed grammars into one rule set under short fresh names (`x0`,
  `x1`, ...; short because the text is the compiled-grammar cache key of every request); a rule
  identical to one imported before (same name and body, every rule it uses identical too) is
  written once, so the JSON string rules that every property's grammar repeats appear once. `reachable(lines, roots)` drops the rules no root uses.
"""

from __future__ import annotations

import re

_RULE_START = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) ::= ", re.MULTILINE)


def grammar_rules(text: str) -> dict[str, str]:
    """`{name: body}` of every rule in printed EBNF, in order."""
    starts = list(_RULE_START.finditer(text))
    ends = [m.start() for m in starts[1:]] + [len(text)]
    return {m.group(1): text[m.end():end].strip() for m, end in zip(starts, ends)}


def _tokens(body: str):
    """(is_identifier, text) pieces of a rule body; literals and classes are never identifiers."""
    i = 0
    while i < len(body):
        c = body[i]
        if c in '"[':
            close = '"' if c == '"' else "]"
            j = i + 1
            while j < len(body) and body[j] != close:
                j += 2 if body[j] == "\\" else 1
            yield False, body[i:j + 1]
            i = j + 1
        elif c.isalpha() or c == "_":
            j = i + 1
            while j < len(body) and (body[j].isalnum() or body[j] == "_"):
                j += 1
            yield True, body[i:j]
            i = j
        else:
            yield False, c
            i += 1


def rule_references(body: str) -> set[str]:
    """Identifiers outside literals (rule names, plus macro words such as `TagDispatch`)."""
    return {text for is_name, text in _tokens(body) if is_name}


def rename_references(body: str, mapping: dict[str, str]) -> str:
    return "".join(mapping.get(text, text) if is_name else text for is_name, text in _tokens(body))


class RulePool:
    """Printed grammars imported under short fresh names (`x0`, `x1`, ...), rules shared where identical."""

    def __init__(self) -> None:
        self.shared: dict[str, tuple[str, str]] = {}  # original name -> (body, new name) of shared rules
        self.count = 0

    def _fresh(self) -> str:
        self.count += 1
        return f"x{self.count - 1}"

    def add(self, text: str, keep_apart=lambda name: False) -> tuple[dict[str, str], list[str]]:
        """Import one printed grammar: (original name -> new name, new rule lines). A rule is shared
        when an identical one (same name, same body, every rule it uses shared too) was imported
        before; rules for which `keep_apart(name)` holds (the grammar's own root rules) never are."""
        rules = grammar_rules(text)
        candidates = {n for n, b in rules.items() if not keep_apart(n) and self.shared.get(n, (b,))[0] == b}
        changed = True
        while changed:  # a rule is shared only if every rule it uses is shared too
            unshared = {n for n in candidates if any(r in rules and r not in candidates for r in rule_references(rules[n]))}
            candidates -= unshared
            changed = bool(unshared)
        fresh = [n for n in rules if n not in candidates or n not in self.shared]
        mapping = {n: self.shared[n][1] for n in candidates if n in self.shared}
        mapping.update((n, self._fresh()) for n in fresh)
        for n in fresh:
            if n in candidates:
                self.shared[n] = (rules[n], mapping[n])
        return mapping, [f"{mapping[n]} ::= {rename_references(rules[n], mapping)}" for n in fresh]


def reachable(lines: list[str], roots: list[str]) -> list[str]:
    """The rule lines that `roots` use (directly or not), in their order."""
    rules = grammar_rules("\n".join(lines))
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen or name not in rules:
            continue
        seen.add(name)
        todo.extend(rule_references(rules[name]))
    return [f"{n} ::= {b}" for n, b in rules.items() if n in seen]
