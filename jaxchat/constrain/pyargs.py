"""EBNF for Python-style tool calls (LFM2: `[get_weather(city="Paris", days=3)]`), typed from JSON schemas.

Contract: `python_calls_grammar(tools, single, arguments=None)` returns an EBNF grammar (root rule `root`) for the
inside of an LFM2 call list: one call when `single`, else calls separated by `, `; `tools` is a
list of (name, parameters schema); `arguments` gives the ready rules of a tool's argument list instead (a custom
tool's input, `jaxchat.constrain.custom_tools.python_arguments`). All argument lists and nested dicts come from ONE helper,
`argument_list_rules()`: required properties required, optional ones skippable, none twice,
values typed from the schema; a call's keyword arguments in any order (exact up to
`any_order.MAX_ANY_ORDER` of them, any order within groups of that many above), a nested dict's
entries in declared order (as xgrammar writes nested JSON objects). The Python literals written
are the subset `jaxchat.chat`'s relaxed-args dialect reads: double- or single-quoted strings (escapes \\" \\' \\\\ \\n \\r \\t;
`<|` is never written, so no marker can appear in a string), integers and decimals bounded to 16
digits each side of the point, True/False/None, lists, dicts with string keys. String enums and
consts are spelled out; integer/number ranges reuse xgrammar's own range grammar; whitespace is at
most one space after a comma or colon. Strings are right-recursive rules (`py_rest`/`py_lt`), the
shape whose token masks xgrammar precomputes: a `py_char*` star with a two-character alternative
cost ~100 ms per mask fill inside a string, this form ~0.1 ms. Unsupported keywords (pattern,
format, lengths) are ignored.
"""

from __future__ import annotations

import json
import re

import xgrammar as xgr

from jaxchat.constrain.any_order import MAX_ANY_ORDER, any_order_rules

_BASE = r"""
ws1 ::= " "?
sep ::= "," ws1
py_str ::= "\"" py_rest | "'" py_srest
py_rest ::= "\"" | [^"\\<\x00-\x1f] py_rest | py_esc py_rest | "<" py_lt
py_lt ::= "\"" | [^"\\<|\x00-\x1f] py_rest | py_esc py_rest | "<" py_lt
py_srest ::= "'" | [^'\\<\x00-\x1f] py_srest | py_esc py_srest | "<" py_slt
py_slt ::= "'" | [^'\\<|\x00-\x1f] py_srest | py_esc py_srest | "<" py_slt
py_esc ::= "\\" ["'\\nrt]
py_int ::= "-"? ("0" | [1-9] [0-9]{0,15})
py_num ::= py_int ("." [0-9]{1,16})?
py_bool ::= "True" | "False"
py_none ::= "None"
py_any ::= py_str | py_num | py_bool | py_none | py_list | py_dict
py_list ::= "[" (py_any (sep py_any)*)? "]"
py_dict ::= "{" (py_str ":" ws1 py_any (sep py_str ":" ws1 py_any)*)? "}"
"""


def _python(value, quote: str = '"') -> str:
    """The Python literal of a JSON value, strings in `quote`s."""
    if value is True or value is False or value is None:
        return {True: "True", False: "False", None: "None"}[value]
    if isinstance(value, list):
        return "[" + ", ".join(_python(v, quote) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_python(str(k), quote)}: {_python(v, quote)}" for k, v in value.items()) + "}"
    if isinstance(value, str) and quote == "'":
        return "'" + json.dumps(value, ensure_ascii=False)[1:-1].replace('\\"', '"').replace("'", "\\'") + "'"
    return json.dumps(value, ensure_ascii=False)


def _literal(value) -> str:
    """An EBNF expression spelling the Python literal of `value` (enum / const members, dict keys),
    with either quote style."""
    spellings = dict.fromkeys(json.dumps(_python(value, q), ensure_ascii=False) for q in "\"'")
    return spellings.popitem()[0] if len(spellings) == 1 else "(" + " | ".join(spellings) + ")"


def _kwarg_key(key: str) -> str:
    return json.dumps(f"{key}=")


def _dict_key(key: str) -> str:
    return _literal(key) + ' ":" ws1'


class _Rules:
    """Collects EBNF rules with unique names."""

    def __init__(self, defs: dict | None = None):
        self.lines: list[str] = []
        self.count = 0
        self.defs = defs or {}
        self.refs: dict[str, str] = {}

    def new(self, hint: str) -> str:
        self.count += 1
        return f"r{self.count}_{re.sub(r'[^A-Za-z0-9]', '', hint)[:20]}"

    def add(self, name: str, body: str) -> str:
        self.lines.append(f"{name} ::= {body}")
        return name

    def value(self, schema, hint: str = "v") -> str:
        """The rule name (or inline expression) of a value of `schema`."""
        if not isinstance(schema, dict) or not schema:
            return "py_any"
        if "$ref" in schema:
            return self._ref(schema["$ref"])
        if "const" in schema:
            return _literal(schema["const"])
        if "enum" in schema:
            return "(" + " | ".join(_literal(v) for v in schema["enum"]) + ")"
        for key in ("anyOf", "oneOf"):
            if isinstance(schema.get(key), list):
                return "(" + " | ".join(self.value(s, hint) for s in schema[key]) + ")"
        types = schema.get("type")
        if isinstance(types, list):
            return "(" + " | ".join(self.value({**schema, "type": t}, hint) for t in types) + ")"
        if types == "string":
            return "py_str"
        if types == "boolean":
            return "py_bool"
        if types == "null":
            return "py_none"
        if types in ("integer", "number"):
            return self._number(schema, hint)
        if types == "array" or "items" in schema:
            return self._array(schema, hint)
        if types == "object" or "properties" in schema:
            if not schema.get("properties"):
                return "py_dict"
            name = self.new(hint)
            return self.add(name, "\"{\" " + argument_list_rules(self, schema, name, _dict_key) + " \"}\"")
        return "py_any"

    def _ref(self, ref: str) -> str:
        if ref not in self.refs:
            key = ref.rsplit("/", 1)[-1]
            self.refs[ref] = name = self.new("ref" + key)
            self.add(name, self.value(self.defs.get(key, {}), key))
        return self.refs[ref]

    def _number(self, schema: dict, hint: str) -> str:
        ranged = {k: schema[k] for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in schema}
        if not ranged:
            return "py_int" if schema["type"] == "integer" else "py_num"
        # xgrammar's own range grammar (its JSON numbers are Python numbers), rules renamed.
        text = str(xgr.Grammar.from_json_schema(json.dumps({"type": schema["type"], **ranged})))
        prefix = self.new(hint) + "_"
        names = re.findall(r"^(\w+) ::=", text, flags=re.MULTILINE)
        pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
        self.lines.extend(pattern.sub(lambda m: prefix + m.group(1), line) for line in text.splitlines() if line)
        return prefix + "root"

    def _array(self, schema: dict, hint: str) -> str:
        item = self.value(schema.get("items", {}), hint + "i")
        lo, hi = int(schema.get("minItems", 0)), schema.get("maxItems")
        if hi is not None and int(hi) == 0:
            return '"[]"'
        rest = f"(sep {item}){{{max(lo - 1, 0)},{int(hi) - 1 if hi is not None else -1}}}"
        body = f"{item} {rest}"
        return self.add(self.new(hint), f'"[" {body} "]"' if lo > 0 else f'"[" ({body})? "]"')


def argument_list_rules(rules: _Rules, schema: dict, name: str, key_rule, group_size: int = 1) -> str:
    """Rules for the properties of an object schema; returns the list's rule name.

    `key_rule(key)` spells one key as EBNF: `"city="` for call keywords, `"\\"city\\":" ws1` for
    dict entries. Required properties must appear, optional ones may be skipped, none twice, a
    separator between two present ones. `group_size` 1 is the declared order; larger groups admit
    any order within consecutive groups of that many properties (`any_order.any_order_rules`).
    """
    props = list((schema.get("properties") or {}).items())
    required = set(schema.get("required") or ())
    pieces = [rules.add(f"{name}_p{i}", key_rule(key) + " " + rules.value(sub, key)) for i, (key, sub) in enumerate(props)]
    start, lines = any_order_rules(pieces, [key in required for key, _ in props], "", "sep", f"{name}_", group_size)
    rules.lines.extend(lines)
    return start


def python_calls_grammar(tools: list[tuple[str, dict]], single: bool,
                         arguments: dict[str, tuple[str, str]] | None = None) -> str:
    """EBNF for the calls inside `[...]` of an LFM2 tool-call block; `arguments` maps a tool's name to the
    `(rule, rules)` that spell its whole argument list instead of its schema (a custom tool's input)."""
    rules = _Rules()
    calls = []
    for name, schema in tools:
        rules.defs = {**(schema.get("$defs") or {}), **(schema.get("definitions") or {})}
        rule = rules.new(name)
        if arguments and name in arguments:
            args, text = arguments[name]
            rules.lines.extend(text.splitlines())
        else:
            args = argument_list_rules(rules, schema, rule, _kwarg_key, MAX_ANY_ORDER)
        calls.append(rules.add(rule, json.dumps(name + "(") + f" {args} " + '")"'))
    call = " | ".join(calls)
    root = f"root ::= ({call})" + ("" if single else f" (sep ({call}))*")
    return "\n".join([root, *rules.lines, _BASE.strip()])
