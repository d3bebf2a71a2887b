"""Qwen3-Coder / Qwen3.5 XML tool calls, typed by the tool's JSON schema, converted prefix-stably.

Contract: `parse_qwen_xml_call(body, partial, schema)` reads
`<function=NAME>` (`<parameter=KEY>` VALUE `</parameter>`)* `</function>` and returns a `ParsedCall`
whose arguments are canonical JSON. One leading and one trailing newline of each VALUE are not
part of it. The syntax does not type values, so `schema` (the tool's "parameters" object) does,
via `properties[KEY]` ("type" as a string or list, "anyOf"/"oneOf"/"allOf", else "enum"/"const"; a value
from an "enum"/"const" list is held until `</parameter>` and whitespace around it is padding):
  - exactly "string": the raw value as a JSON string, streamed as it arrives (a trailing newline
    and a partial `</parameter>` are held back);
  - "object"/"array" (without "string") and a value starting with `{` or `[`: converted with the
    JSON-or-Python-literal dialect, streamed;
  - anything else is held until `</parameter>` and then converted by the first declared type it
    fits (null, boolean, integer, number, then string); with no type, or none that fits, the value
    becomes the JSON value `json.loads` reads from it, else a string.
"""

from __future__ import annotations

import json
import math
import re

from jaxchat.chat.args_core import (
    JSON,
    RELAXED,
    ArgumentSyntaxError,
    NeedMoreText,
    ParsedCall,
    ValueConverter,
    convert_value,
    held_marker_length,
    json_quote,
    python_number_json,
)

_FUNCTION_OPEN = "<function="
_FUNCTION_CLOSE = "</function>"
_PARAMETER_OPEN = "<parameter="
_PARAMETER_CLOSE = "</parameter>"
_HELD_BEFORE_CLOSE = ("\n" + _PARAMETER_CLOSE, _PARAMETER_CLOSE)
_INTEGER = re.compile(r"[-+]?\d+")
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_PYTHON_TYPE_NAMES = {bool: "boolean", int: "integer", float: "number", str: "string", type(None): "null",
                      dict: "object", list: "array"}


def parse_qwen_xml_call(body: str, partial: bool, schema: dict | None) -> ParsedCall:
    converter = ValueConverter(body, RELAXED, partial)
    try:
        pos = converter.ws(0)
        pos += len(converter.expect_one_of(pos, (_FUNCTION_OPEN,)))
        name, pos = _read_tag_name(converter, pos, "function")
    except NeedMoreText:
        return ParsedCall(None, "", False, len(body))
    properties = schema.get("properties") if isinstance(schema, dict) else None
    converter.emit("{")
    try:
        end = _read_parameters(converter, pos, properties if isinstance(properties, dict) else {})
    except NeedMoreText:
        return ParsedCall(name, converter.output(), False, len(body))
    return ParsedCall(name, converter.output(), True, end)


def _read_tag_name(converter: ValueConverter, pos: int, tag: str) -> tuple[str, int]:
    """The NAME of `<tag=NAME>` starting at `pos`; complete only once `>` is seen."""
    text = converter.text
    close = text.find(">", pos)
    name = text[pos : close if close >= 0 else len(text)]
    if "<" in name or "\n" in name:
        converter.fail(f"unterminated <{tag}=...> tag", pos)
    if close < 0:
        converter.end_of_text(len(text))
    if not name.strip():
        converter.fail(f"empty {tag} name", pos)
    return name.strip(), close + 1


def _read_parameters(converter: ValueConverter, pos: int, properties: dict) -> int:
    first = True
    while True:
        pos = converter.ws(pos)
        marker = converter.expect_one_of(pos, (_PARAMETER_OPEN, _FUNCTION_CLOSE))
        if marker == _FUNCTION_CLOSE:
            converter.emit("}")
            return pos + len(_FUNCTION_CLOSE)
        key, pos = _read_tag_name(converter, pos + len(_PARAMETER_OPEN), "parameter")
        converter.emit(("" if first else ", ") + json_quote(key) + ": ")
        first = False
        pos = _read_value(converter, pos, declared_types(properties.get(key)))


def _read_value(converter: ValueConverter, pos: int, types: frozenset[str]) -> int:
    text = converter.text
    close = text.find(_PARAMETER_CLOSE, pos)
    if close >= 0:
        value_pos = pos + 1 if text.startswith("\n", pos) else pos  # where the stripped value starts
        converter.emit(_value_json(_strip_one_newline(text[pos:close]), types, value_pos))
        return close + len(_PARAMETER_CLOSE)
    if not converter.partial:
        converter.fail(f"missing {_PARAMETER_CLOSE}", pos)
    visible = text[pos : len(text) - held_marker_length(text, _HELD_BEFORE_CLOSE, pos)]
    converter.emit(_partial_value_json(visible, types, pos))
    raise NeedMoreText


_ENUM = "enum"  # a pseudo-type in `declared_types`: the schema lists the allowed values


def _strip_one_newline(value: str) -> str:
    value = value.removeprefix("\n")
    return value.removesuffix("\n")


def _streams_as_string(types: frozenset[str]) -> bool:
    return types == {"string"}


def _streams_as_container(types: frozenset[str], value: str) -> bool:
    return bool(types & {"object", "array"}) and "string" not in types and value.lstrip()[:1] in ("{", "[")


def _partial_value_json(visible: str, types: frozenset[str], pos: int) -> str:
    """What is certain about a value whose `</parameter>` has not arrived (already held back)."""
    if _streams_as_string(types):
        return json_quote(visible.removeprefix("\n"))[:-1]
    if _streams_as_container(types, visible):
        arguments, complete, end = convert_value(visible, RELAXED, partial=True, base=pos)
        if complete and visible[end:].strip():
            raise _trailing_text_error(pos + end)
        return arguments
    return ""


def _value_json(value: str, types: frozenset[str], pos: int) -> str:
    if _streams_as_string(types):
        return json_quote(value)
    text = value.strip()
    if _streams_as_container(types, value):
        arguments, _, end = convert_value(value, RELAXED, partial=False, base=pos)
        if value[end:].strip():
            raise _trailing_text_error(pos + end)
        return arguments
    for typ in ("null", "boolean", "integer", "number"):
        converted = _SCALAR_CONVERTERS[typ](text) if typ in types else None
        if converted is not None:
            return converted
    if _ENUM in types and "string" in types:
        return json_quote(text)
    if "string" in types:
        return json_quote(value)
    return _untyped_value_json(value)


def _trailing_text_error(offset: int) -> ArgumentSyntaxError:
    return ArgumentSyntaxError(f"Qwen XML arguments: unexpected text after the value at offset {offset}")


def _null_json(text: str) -> str | None:
    return "null" if text in ("null", "None") else None


def _boolean_json(text: str) -> str | None:
    return text.lower() if text.lower() in ("true", "false") else None


def _integer_json(text: str) -> str | None:
    return str(int(text)) if _INTEGER.fullmatch(text) else None


def _number_json(text: str) -> str | None:
    return text if _JSON_NUMBER.fullmatch(text) else python_number_json(text)


_SCALAR_CONVERTERS = {"null": _null_json, "boolean": _boolean_json, "integer": _integer_json, "number": _number_json}


def _untyped_value_json(value: str) -> str:
    """The JSON value `json.loads` reads from `value` (canonicalised), else `value` as a string."""
    text = value.strip()
    try:
        decoded = json.loads(text)
    except ValueError:
        return json_quote(value)
    if not _all_finite(decoded):  # NaN / Infinity are not JSON
        return json_quote(value)
    try:
        return convert_value(text, JSON, partial=False)[0]
    except ArgumentSyntaxError:  # valid JSON nested deeper than the converter allows
        return json_quote(value)


def _all_finite(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(item) for item in value.values())
    if isinstance(value, list):
        return all(_all_finite(item) for item in value)
    return True


def declared_types(prop: object) -> frozenset[str]:
    """The JSON types a property schema allows ("type", "anyOf"/"oneOf"/"allOf", "enum"/"const")."""
    if not isinstance(prop, dict):
        return frozenset()
    declared = prop.get("type")
    if isinstance(declared, str):
        types = {declared}
    else:
        types = {t for t in declared if isinstance(t, str)} if isinstance(declared, list) else set()
    for combinator in ("anyOf", "oneOf", "allOf"):
        for sub in prop.get(combinator) or ():
            types |= declared_types(sub)
    if not types:
        examples = list(prop.get("enum") or ()) + ([prop["const"]] if "const" in prop else [])
        types = {_PYTHON_TYPE_NAMES[type(v)] for v in examples if type(v) in _PYTHON_TYPE_NAMES}
    if "enum" in prop or "const" in prop:
        types.add(_ENUM)  # a closed set of values: held until complete, surrounding whitespace is padding
    if not types and "properties" in prop:
        types = {"object"}
    if not types and "items" in prop:
        types = {"array"}
    return frozenset(types)
