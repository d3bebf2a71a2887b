"""Call syntaxes with JSON arguments of the Llama 3, Mistral and DeepSeek V3 formats.

Contract: the same as `chat.args` (prefix-stable canonical JSON, names reported once complete,
`ArgumentSyntaxError` for text that cannot be a prefix of the syntax), for:
  - `parse_llama_call(body, partial)`: `{"name": "f", "parameters": {...}}` ("arguments" is an alias,
    an optional leading `"type": "function"` is accepted), keys in exactly this order, so that a JSON
    object that is not a call is told apart by its first keys. The name is reported only once the
    parameters key has been read;
  - `parse_mistral_call(body, partial)`: the text after `[TOOL_CALLS]`, either
    `name[ARGS]{...}` (optionally `name[CALL_ID]id[ARGS]{...}`), one call, or a JSON array of
    `{"name": ..., "arguments": ...}` objects (other keys such as "id" are read and dropped);
  - `parse_deepseek_calls(body, partial)`: the body of a `<｜tool▁calls▁begin｜>` block, calls
    `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>` (R1) or
    `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>` (V3.1), whitespace between them.
The first two return `(calls, end)`: `end` is the index in `body` just after the call syntax once it
is closed, else None (the calls so far, the last one possibly incomplete). Arguments must be a JSON
object.
"""

from __future__ import annotations

import re

from jaxchat.chat.args import read_json_call
from jaxchat.chat.args_core import JSON, ArgumentSyntaxError, NeedMoreText, ParsedCall, ValueConverter
from jaxchat.chat.spec import DEEPSEEK_CALL_BEGIN, DEEPSEEK_CALL_END, DEEPSEEK_SEP, MISTRAL_ARGS, MISTRAL_CALL_ID

__all__ = ["ArgumentSyntaxError", "parse_deepseek_calls", "parse_llama_call", "parse_mistral_call"]

_NAME = re.compile(r"[\w.\-]+")
_CALL_ID = re.compile(r"[A-Za-z0-9]+")
_ARGUMENT_KEYS = ("parameters", "arguments")
_FENCE = "```"
_FENCE_LANGUAGE = "json"


def _arguments(converter: ValueConverter, pos: int) -> int:
    """Read the arguments object at `pos` into the converter's (fresh) output."""
    converter.out = []
    pos = converter.ws(pos)
    if converter.peek(pos) != "{":
        converter.fail("the arguments must be a JSON object", pos)
    return converter.value(pos)


def _args_call(converter: ValueConverter, name: str, pos: int, after) -> ParsedCall:
    """The call `name` whose arguments start at `pos`; `after(end)` reads what closes the call."""
    try:
        end = after(_arguments(converter, pos))
    except NeedMoreText:
        return ParsedCall(name, converter.output(), False, len(converter.text))
    return ParsedCall(name, converter.output(), True, end)


# -- Llama 3 --------------------------------------------------------------------------------------
def _key_and_colon(converter: ValueConverter, pos: int) -> tuple[str, int]:
    key, pos = converter.key(converter.ws(pos))
    pos = converter.ws(pos)
    if converter.peek(pos) != ":":
        converter.fail(f"expected ':' after key {key!r}", pos)
    return key, converter.ws(pos + 1)


def _string(converter: ValueConverter, pos: int, what: str) -> tuple[str, int]:
    if converter.peek(pos) != '"':
        converter.fail(f"{what} must be a string", pos)
    value, closed, end = converter.lex_string(pos, '"')
    if not closed:
        raise NeedMoreText
    return value, end


def _comma(converter: ValueConverter, pos: int) -> int:
    pos = converter.ws(pos)
    if converter.peek(pos) != ",":
        converter.fail("expected ','", pos)
    return pos + 1


def parse_llama_call(body: str, partial: bool) -> ParsedCall:
    converter = ValueConverter(body, JSON, partial)
    try:
        pos = converter.ws(0)
        if converter.peek(pos) != "{":
            converter.fail("expected '{' to open a JSON tool call", pos)
        key, pos = _key_and_colon(converter, pos + 1)
        if key == "type":
            kind, pos = _string(converter, pos, '"type"')
            if kind != "function":
                converter.fail(f'"type" {kind!r} is not "function"', pos)
            key, pos = _key_and_colon(converter, _comma(converter, pos))
        if key != "name":
            converter.fail(f'a JSON tool call starts with "name", not {key!r}', pos)
        name, pos = _string(converter, pos, '"name"')
        key, pos = _key_and_colon(converter, _comma(converter, pos))
        if key not in _ARGUMENT_KEYS:
            converter.fail(f'expected "parameters" after the name, not {key!r}', pos)
    except NeedMoreText:
        return ParsedCall(None, "", False, len(body))

    def close(end: int) -> int:
        end = converter.ws(end)
        if converter.peek(end) != "}":
            converter.fail("expected '}' to close the tool call", end)
        return end + 1

    return _args_call(converter, name, pos, close)


# -- Mistral --------------------------------------------------------------------------------------
def parse_mistral_call(body: str, partial: bool) -> tuple[list[ParsedCall], int | None]:
    converter = ValueConverter(body, JSON, partial)
    try:
        pos = converter.ws(0)
        if converter.peek(pos) == "[":
            return _mistral_array(converter, pos + 1)
        name, pos = converter.word(pos, _NAME, "a function name")
        marker = converter.expect_one_of(converter.ws(pos), (MISTRAL_ARGS, MISTRAL_CALL_ID))
        pos = converter.ws(pos) + len(marker)
        if marker == MISTRAL_CALL_ID:
            _, pos = converter.word(converter.ws(pos), _CALL_ID, "a call id")
            pos = converter.ws(pos)
            pos += len(converter.expect_one_of(pos, (MISTRAL_ARGS,)))
    except NeedMoreText:
        return [], None
    call = _args_call(converter, name, pos, lambda end: end)
    return [call], call.end if call.complete else None


def _mistral_array(converter: ValueConverter, pos: int) -> tuple[list[ParsedCall], int | None]:
    calls: list[ParsedCall] = []
    try:
        pos = converter.ws(pos)
        if converter.peek(pos) == "]":
            return calls, pos + 1
        while True:
            call = read_json_call(converter, pos)
            if call.name is not None:
                calls.append(call)
            if not call.complete:
                return calls, None
            pos = converter.ws(call.end)
            if converter.after_element(pos, "]"):
                return calls, pos + 1
            pos = converter.ws(pos + 1)
    except NeedMoreText:
        return calls, None


# -- DeepSeek V3 ----------------------------------------------------------------------------------
def parse_deepseek_calls(body: str, partial: bool) -> list[ParsedCall]:
    converter = ValueConverter(body, JSON, partial)
    calls: list[ParsedCall] = []
    pos = converter.ws(0)
    try:
        while pos < len(body) or partial:
            pos += len(converter.expect_one_of(pos, (DEEPSEEK_CALL_BEGIN,)))
            call = _deepseek_call(converter, pos)
            if call.name is not None:
                calls.append(call)
            if not call.complete:
                break
            pos = converter.ws(call.end)
    except NeedMoreText:
        pass
    return calls


def _deepseek_call(converter: ValueConverter, pos: int) -> ParsedCall:
    try:
        head, pos = converter.word(converter.ws(pos), _NAME, "a function name or type")
        pos = converter.ws(pos)
        pos += len(converter.expect_one_of(pos, (DEEPSEEK_SEP,)))
        if converter.peek(converter.ws(pos)) == "{":  # V3.1: NAME<｜tool▁sep｜>{...}
            name, fenced = head, False
        else:  # R1: TYPE<｜tool▁sep｜>NAME\n```json\n{...}\n```
            name, pos = converter.word(converter.ws(pos), _NAME, "a function name")
            pos = _fence(converter, converter.ws(pos), _FENCE_LANGUAGE)
            fenced = True
    except NeedMoreText:
        return ParsedCall(None, "", False, len(converter.text))

    def close(end: int) -> int:
        if fenced:
            end = _fence(converter, converter.ws(end), "")
        end = converter.ws(end)
        return end + len(converter.expect_one_of(end, (DEEPSEEK_CALL_END,)))

    return _args_call(converter, name, pos, close)


def _fence(converter: ValueConverter, pos: int, language: str) -> int:
    """A Markdown code fence at `pos`, then `language` if it follows (it may be left out)."""
    pos += len(converter.expect_one_of(pos, (_FENCE,)))
    if not language or converter.text.startswith(language, pos):
        return pos + len(language)
    rest = converter.text[pos:]
    if len(rest) < len(language) and language.startswith(rest):
        converter.end_of_text(len(converter.text))
    return pos
