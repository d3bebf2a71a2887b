"""Tool arguments in any order: a `json_schema` format rewritten so that its top-level properties may
come in any order.

Contract: `any_order_arguments(fmt, group_size=MAX_ANY_ORDER)` takes the structural-tag
`json_schema` format of a tool's arguments (style "json", "qwen_xml" or "gemma", with its
`excludes` and `max_whitespace_cnt`) and returns a `grammar` format that accepts the schema's top-level properties in any order, each at
most once, all required ones present, no other property, and every value exactly as the original
format constrains it (nested objects keep their declared order). See `any_order.py` for the bound:
up to `MAX_ANY_ORDER` properties exact, above it any order within consecutive groups of that many.

The property pieces come from xgrammar itself, so the syntax is the builtin style's to the byte: for
each property, the format of a one-property object `{"properties": {k: schema_k}, "required": [k]}`
is printed as EBNF and the property's piece (its key and value: `"\\"k\\"" ws ":" ws VALUE` in JSON,
`k ws ":" ws VALUE` in Gemma's style, `"<parameter=k" ">" VALUE "</parameter>"` in Qwen XML's) is
cut out of the object rule; the pieces are joined as the style's own object rule joins them (JSON
and Gemma: `"{" ws P1 ws "," ws P2 ... ws "}"`; Qwen XML: `ws P1 ws P2 ... ws`), whitespace runs
bounded by `max_whitespace_cnt`.

The format comes back unchanged (declared order, as xgrammar writes it) where the any-order grammar
would change the schema's meaning or cannot be built: fewer than two properties, extra properties
allowed (`additionalProperties` true or a schema), any top-level keyword other than `type`,
`properties`, `required`, `additionalProperties: false`, `$defs` / `definitions` and annotations
(combinators, `patternProperties`, property counts and dependencies change which sets of keys are
valid), a required name that is not a property, a `$ref` outside `#/$defs/` and `#/definitions/`,
a property xgrammar cannot build alone (its error then comes from the declared-order format when
it is compiled), or a property piece xgrammar prints in an unexpected shape.
"""

from __future__ import annotations

import functools
import json
import re

import xgrammar as xgr

from jaxchat.constrain.any_order import MAX_ANY_ORDER, any_order_rules
from jaxchat.constrain.ebnf_text import RulePool, grammar_rules, reachable, rename_references

_ANNOTATIONS = {"title", "description", "$schema", "$id", "$comment", "examples", "default", "deprecated",
                "readOnly", "writeOnly"}
_OBJECT_KEYS = {"type", "properties", "required", "additionalProperties", "$defs", "definitions"} | _ANNOTATIONS
_WS = r"\w+(?:\{0, \d+\}|\*)"
# The one-property object rule as xgrammar 0.2.x prints it, the property's piece in group 1.
_OBJECT_SHAPES = {
    "json": re.compile(rf'\(\("\{{" {_WS} (.+) {_WS} "\}}"\)\)', re.DOTALL),
    "gemma": re.compile(rf'\(\("\{{" {_WS} (.+) {_WS} "\}}"\)\)', re.DOTALL),
    "qwen_xml": re.compile(rf"\(\({_WS} (.+) {_WS}\)\)", re.DOTALL),
}


class _Unsupported(Exception):
    """The any-order grammar does not apply; the declared-order format stays."""


def any_order_arguments(fmt: dict, group_size: int = MAX_ANY_ORDER) -> dict:
    """The any-order `grammar` format equivalent to the `json_schema` format `fmt`, or `fmt` itself;
    `group_size` is the bound (exact any order up to that many properties)."""
    if not _eligible(fmt.get("json_schema")):
        return fmt
    try:
        grammar = _any_order_grammar(json.dumps(fmt, ensure_ascii=False), group_size)
    except _Unsupported:
        return fmt
    return {"type": "grammar", "grammar": grammar}


def _eligible(schema) -> bool:
    if not isinstance(schema, dict) or set(schema) - _OBJECT_KEYS:
        return False
    props, required = schema.get("properties"), schema.get("required", [])
    return (schema.get("type", "object") == "object" and isinstance(props, dict) and len(props) >= 2
            and schema.get("additionalProperties", False) is False
            and isinstance(required, list) and all(isinstance(r, str) and r in props for r in required)
            and _local_refs_only(schema))


def _local_refs_only(value) -> bool:
    if isinstance(value, dict):
        ref = value.get("$ref")
        if ref is not None and not (isinstance(ref, str) and ref.startswith(("#/$defs/", "#/definitions/"))):
            return False
        return all(_local_refs_only(v) for v in value.values())
    if isinstance(value, list):
        return all(_local_refs_only(v) for v in value)
    return True


@functools.lru_cache(maxsize=1024)
def _any_order_grammar(fmt_json: str, group_size: int) -> str:
    fmt = json.loads(fmt_json)
    schema, style = fmt["json_schema"], fmt.get("style", "json")
    if style not in _OBJECT_SHAPES:
        raise _Unsupported(style)
    max_ws = fmt.get("max_whitespace_cnt")
    ws = "[ \\n\\r\\t]" + ("*" if max_ws is None else f"{{0,{int(max_ws)}}}")
    defs = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
    pool, lines, pieces = RulePool(), [], []
    for key, sub in schema["properties"].items():
        one = {"type": "object", "properties": {key: sub}, "required": [key], "additionalProperties": False, **defs}
        try:
            printed = str(xgr.Grammar.from_structural_tag(json.dumps(
                {"type": "structural_tag", "format": {**fmt, "json_schema": one}}, ensure_ascii=False)))
        except RuntimeError as e:  # e.g. a `false` property schema: the declared-order format says so itself
            raise _Unsupported(f"property {key!r}: {e}") from e
        rules = grammar_rules(printed)
        root = _root_body(rules)
        shape = _OBJECT_SHAPES[style].fullmatch(rules.get(root, ""))
        if shape is None:
            raise _Unsupported(f"property {key!r}: {rules.get(root, '')[:200]}")
        mapping, imported = pool.add(printed, keep_apart=lambda name: name == "root" or name.startswith("root_"))
        lines.extend(imported)
        piece = f"p{len(pieces)}"
        lines.append(f"{piece} ::= " + rename_references(shape.group(1), mapping))
        pieces.append(piece)
    required = set(schema.get("required", []))
    if style == "qwen_xml":
        top, comma = "root ::= s0e ws", "c ::= ws"
    else:
        top, comma = 'root ::= "{" s0e ws "}"', 'c ::= ws "," ws'
    start, states = any_order_rules(pieces, [k in required for k in schema["properties"]], "ws", "c", "s",
                                    group_size)
    assert start == "s0e"
    own = [top, *states, comma, f"ws ::= {ws}", *lines]
    return "\n".join(reachable(own, ["root"]))


def _root_body(rules: dict[str, str]) -> str:
    """The object rule: xgrammar prints `root ::= ((root_0))` around it."""
    inner = re.fullmatch(r"\(\((\w+)\)\)", rules.get("root", ""))
    if inner is None:
        raise _Unsupported(f"root rule {rules.get('root', '')[:200]}")
    return inner.group(1)

