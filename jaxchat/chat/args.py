"""Tool-call argument dialects, converted to canonical JSON text prefix-stably.

Contract: the chat parser calls one function per tool block body:
  - `parse_json_arguments(text, partial)`: one JSON value (Harmony message bodies);
  - `parse_hermes_call(body, partial)`: `{"name": ..., "arguments": {...} | "<JSON text>"}`
    ("parameters" is an alias; either key order);
  - `parse_qwen_xml_call(body, partial, schema)`: `<function=f><parameter=k>v</parameter></function>`,
    values typed by the tool's JSON schema (see `args_xml.py`);
  - `parse_python_calls(body, partial)`: LFM2 `[f(a=1, b='x'), g()]`;
  - `parse_gemma4_call(body, partial)`: `call:f{a:<|"|>x<|"|>,b:3}`.
Each returns `ParsedCall(name, arguments, complete, end)`. For a body `b` and any continuation `u`,
a reported name never changes and `arguments` for `b` is a prefix of `arguments` for `b + u`
(partial or not). `name` is None (with `arguments == ""`) until the name is completely known.
A complete call without arguments has `arguments == "{}"`. Malformed text, or incomplete text
when `partial=False`, raises `ArgumentSyntaxError` naming the problem and its offset.
Single-call parsers report `end` and leave any text after the call to the caller.
One value converter (`args_core.py`, over the lexer in `args_lexer.py`) serves every dialect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from jaxchat.chat.args_core import (
    GEMMA,
    JSON,
    PYTHON,
    ArgumentSyntaxError,
    NeedMoreText,
    ParsedCall,
    ValueConverter,
    convert_value,
)
from jaxchat.chat.args_xml import parse_qwen_xml_call

__all__ = [
    "ArgumentSyntaxError",
    "ParsedCall",
    "parse_gemma4_call",
    "parse_hermes_call",
    "parse_json_arguments",
    "parse_python_calls",
    "parse_qwen_xml_call",
    "read_json_call",
]

_ARGUMENT_KEYS = ("arguments", "parameters")
_CALL_NAME = re.compile(r"[^\W\d][\w.\-]*")
_GEMMA_CALL_NAME = re.compile(r"[\w.\-]+")


def parse_json_arguments(text: str, partial: bool) -> tuple[str, bool, int]:
    """(canonical JSON, complete, end) for the JSON value at the start of `text`."""
    return convert_value(text, JSON, partial)


# -- Hermes / Qwen JSON ---------------------------------------------------------------------------
@dataclass
class _HermesFields:
    name: str | None = None
    arguments: list[str] | None = None  # canonical JSON pieces once the arguments value started
    seen: set[str] | None = None


def parse_hermes_call(body: str, partial: bool) -> ParsedCall:
    return read_json_call(ValueConverter(body, JSON, partial), 0)


def read_json_call(converter: ValueConverter, pos: int) -> ParsedCall:
    """The `{"name": ..., "arguments": ...}` object at `pos` of the converter's text (also an element
    of Mistral's `[TOOL_CALLS][...]` array); `end` is in that text."""
    fields = _HermesFields(seen=set())
    try:
        end = _read_hermes_object(converter, fields, pos)
    except NeedMoreText:
        return _hermes_result(fields, False, len(converter.text))
    if fields.name is None:
        converter.fail('tool call has no "name"', end - 1)
    return _hermes_result(fields, True, end)


def _hermes_result(fields: _HermesFields, complete: bool, end: int) -> ParsedCall:
    if fields.name is None:
        return ParsedCall(None, "", complete, end)
    arguments = "".join(fields.arguments or ())
    if arguments in ("", "null"):  # absent or null arguments mean no arguments
        arguments = "{}" if complete else ""
    return ParsedCall(fields.name, arguments, complete, end)


def _read_hermes_object(converter: ValueConverter, fields: _HermesFields, pos: int) -> int:
    pos = converter.ws(pos)
    if converter.peek(pos) != "{":
        converter.fail("expected '{' to open the tool call", pos)
    pos = converter.ws(pos + 1)
    if converter.peek(pos) == "}":
        return pos + 1
    while True:
        key_pos = pos
        key, pos = converter.key(pos)
        pos = converter.ws(pos)
        if converter.peek(pos) != ":":
            converter.fail(f"expected ':' after key {key!r}", pos)
        field_name = "arguments" if key in _ARGUMENT_KEYS else key
        if field_name in fields.seen:
            converter.fail(f"duplicate {key!r}", key_pos)
        fields.seen.add(field_name)
        pos = converter.ws(pos + 1)
        if key == "name":
            pos = _read_hermes_name(converter, pos, fields)
        elif field_name == "arguments":
            fields.arguments = converter.out = []
            pos = _read_hermes_arguments(converter, pos)
        else:
            converter.out = []  # other fields are validated and dropped
            pos = converter.value(pos)
        pos = converter.ws(pos)
        if converter.after_element(pos, "}"):
            return pos + 1
        pos = converter.ws(pos + 1)


def _read_hermes_name(converter: ValueConverter, pos: int, fields: _HermesFields) -> int:
    if converter.peek(pos) != '"':
        converter.fail('"name" must be a string', pos)
    name, closed, end = converter.lex_string(pos, '"')
    if not closed:
        raise NeedMoreText
    fields.name = name
    return end


def _read_hermes_arguments(converter: ValueConverter, pos: int) -> int:
    """An arguments object, or a JSON string holding the arguments' JSON text."""
    if converter.peek(pos) != '"':
        return converter.value(pos)
    encoded, closed, end = converter.lex_string(pos, '"')
    converter.emit(_convert_encoded_arguments(encoded, closed, pos))
    if not closed:
        raise NeedMoreText
    return end


def _convert_encoded_arguments(encoded: str, closed: bool, pos: int) -> str:
    if closed and not encoded.strip():
        return "{}"
    try:
        arguments, complete, end = convert_value(encoded, JSON, partial=not closed)
    except ArgumentSyntaxError as error:
        raise ArgumentSyntaxError(f"string-encoded arguments at offset {pos}: {error}") from None
    if complete and encoded[end:].strip():
        raise ArgumentSyntaxError(
            f"string-encoded arguments at offset {pos}: unexpected text after the value at offset {end}"
        )
    return arguments


# -- LFM2 Python calls ----------------------------------------------------------------------------
def parse_python_calls(body: str, partial: bool) -> list[ParsedCall]:
    """Every call of `[f(a=1), g(b='x')]` (brackets optional) whose name is complete."""
    converter = ValueConverter(body, PYTHON, partial)
    calls: list[ParsedCall] = []
    try:
        _read_python_call_list(converter, calls)
    except NeedMoreText:
        pass
    return calls


def _read_python_call_list(converter: ValueConverter, calls: list[ParsedCall]) -> None:
    text = converter.text
    pos = converter.ws(0)
    bracketed = converter.peek(pos) == "["
    if bracketed:
        pos = converter.ws(pos + 1)
        if converter.peek(pos) == "]":
            return _expect_only_whitespace(converter, pos + 1)
    while True:
        pos = converter.ws(_read_python_call(converter, pos, calls))
        if not bracketed and pos >= len(text) and not converter.partial:
            return None
        if bracketed and converter.peek(pos) == "]":
            return _expect_only_whitespace(converter, pos + 1)
        if converter.peek(pos) != ",":
            converter.fail("expected ',' between calls" + (" or ']'" if bracketed else ""), pos)
        pos = converter.ws(pos + 1)
        if bracketed and converter.peek(pos) == "]":
            return _expect_only_whitespace(converter, pos + 1)


def _read_python_call(converter: ValueConverter, pos: int, calls: list[ParsedCall]) -> int:
    name, pos = converter.word(pos, _CALL_NAME, "a function call")
    pos = converter.ws(pos)
    if converter.peek(pos) != "(":
        converter.fail(f"expected '(' after {name!r}", pos)
    converter.out = []
    converter.emit("{")
    try:
        end = converter.members(pos + 1, ")", converter.identifier_key, "=")
    except NeedMoreText:
        calls.append(ParsedCall(name, converter.output(), False, len(converter.text)))
        raise
    calls.append(ParsedCall(name, converter.output(), True, end))
    return end


def _expect_only_whitespace(converter: ValueConverter, pos: int) -> None:
    pos = converter.ws(pos)
    if pos < len(converter.text):
        converter.fail("unexpected text after the call list", pos)


# -- Gemma 4 --------------------------------------------------------------------------------------
def parse_gemma4_call(body: str, partial: bool) -> ParsedCall:
    converter = ValueConverter(body, GEMMA, partial)
    try:
        pos = converter.ws(0)
        pos += len(converter.expect_one_of(pos, ("call:",)))
        name, pos = converter.word(pos, _GEMMA_CALL_NAME, "a function name")
        pos = converter.ws(pos)
        if converter.peek(pos) != "{":
            converter.fail(f"expected '{{' after {name!r}", pos)
    except NeedMoreText:
        return ParsedCall(None, "", False, len(body))
    try:
        end = converter.value(pos)
    except NeedMoreText:
        return ParsedCall(name, converter.output(), False, len(body))
    return ParsedCall(name, converter.output(), True, end)
