"""Dialects, and the lexer shared by every tool-call argument dialect: strings, escapes, markers.

Contract: a `Dialect` says how a value syntax spells strings, literals, numbers and keys (JSON,
Python literals, Gemma 4, and "relaxed" JSON-or-Python). `Lexer(text, dialect, partial)` reads
strings at an offset and returns their decoded text so far; with `partial=True` the text may stop
anywhere and what it returns is certain: an incomplete escape (`\\`, `\\u00`, a high surrogate whose
low half may follow, `\\N{...`) or a partial closing delimiter (`<|"|>`) is held back. Raw control
characters inside quoted strings are accepted (models emit raw newlines). Text that cannot be
(a prefix of) the syntax raises `ArgumentSyntaxError` naming the problem and the offset; the end of
partial text raises `NeedMoreText`. `json_escape` writes string bodies the way
`json.dumps(..., ensure_ascii=False)` does, plus lone surrogates as `\\uXXXX` (valid UTF-8 always).
Stdlib only.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn


class ArgumentSyntaxError(ValueError):
    """Tool-call text that is not (a prefix of) valid syntax; the message names what and where."""


class NeedMoreText(Exception):
    """A partial parse reached the end of the text; the output emitted so far is final."""


JSON_LITERALS = {"true": "true", "false": "false", "null": "null"}
PYTHON_LITERALS = {"True": "true", "False": "false", "None": "null"}
GEMMA_QUOTE = '<|"|>'


@dataclass(frozen=True)
class Dialect:
    name: str
    quotes: tuple[str, ...]  # string delimiters; GEMMA_QUOTE strings are verbatim, others have escapes
    literals: dict[str, str] = field(default_factory=lambda: dict(JSON_LITERALS))
    python_escapes: bool = False  # quoted strings use Python escapes instead of JSON's
    python_numbers: bool = False  # accept 1_000, 0x1f, .5, 5., +3 (converted to JSON numbers)
    bare_keys: bool = False  # object keys may be unquoted (Gemma)
    trailing_commas: bool = False
    tuples: bool = False  # (a, b) is an array
    slash_escape: bool = False  # JSON's \/ is accepted among Python escapes (relaxed dialect)


JSON = Dialect("JSON", ('"',))
PYTHON = Dialect(
    "Python", ('"', "'"), dict(PYTHON_LITERALS), python_escapes=True, python_numbers=True,
    trailing_commas=True, tuples=True,
)
RELAXED = Dialect(
    "JSON/Python", ('"', "'"), {**JSON_LITERALS, **PYTHON_LITERALS}, python_escapes=True,
    python_numbers=True, trailing_commas=True, tuples=True, slash_escape=True,
)
GEMMA = Dialect("Gemma", (GEMMA_QUOTE, '"'), python_numbers=True, bare_keys=True, trailing_commas=True)

_WS = re.compile(r"[ \t\r\n]*")
_HEX_PREFIX = re.compile(r"[0-9a-fA-F]*")
_LOW_SURROGATE_ESCAPE = re.compile(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_LOW_SURROGATE_ESCAPE_PREFIX = re.compile(r"(?:\\(?:u(?:[dD](?:[c-fC-F][0-9a-fA-F]{0,2})?)?)?)?")
_OCTAL = re.compile(r"[0-7]{1,3}")
_UNICODE_NAME_PREFIX = re.compile(r"[A-Za-z0-9 \-]*")
_PLAIN_RUN = {'"': re.compile(r'[^"\\]+'), "'": re.compile(r"[^'\\]+")}

_MUST_ESCAPE = re.compile(r'["\\\x00-\x1f\ud800-\udfff]')
_ESCAPE_NAMES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}
_JSON_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_PYTHON_SIMPLE_ESCAPES = {
    "\n": "", "\\": "\\", "'": "'", '"': '"', "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r",
    "t": "\t", "v": "\v",
}
_PYTHON_HEX_ESCAPE_DIGITS = {"x": 2, "U": 8}


def json_escape(text: str) -> str:
    """The body of a JSON string for `text` (escaping is per character, so it commutes with +)."""
    return _MUST_ESCAPE.sub(lambda m: _ESCAPE_NAMES.get(m.group()) or f"\\u{ord(m.group()):04x}", text)


def json_quote(text: str) -> str:
    return f'"{json_escape(text)}"'


def held_marker_length(text: str, markers: tuple[str, ...], start: int = 0) -> int:
    """Length of the longest tail of text[start:] that is a proper prefix of one of `markers`."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text) - start), longest, -1):
            if text.endswith(marker[:size]):
                longest = size
                break
    return longest


class Lexer:
    """Offsets, markers and strings of one text in one dialect."""

    def __init__(self, text: str, dialect: Dialect, partial: bool, base: int = 0) -> None:
        self.text = text
        self.dialect = dialect
        self.partial = partial
        self.base = base  # added to offsets in error messages (text may be a slice of a body)

    # -- plumbing -------------------------------------------------------------------------------
    def fail(self, what: str, pos: int) -> NoReturn:
        raise ArgumentSyntaxError(f"{self.dialect.name} arguments: {what} at offset {pos + self.base}")

    def end_of_text(self, pos: int) -> NoReturn:
        if self.partial:
            raise NeedMoreText
        self.fail("unexpected end of text", pos)

    def ws(self, pos: int) -> int:
        return _WS.match(self.text, pos).end()

    def peek(self, pos: int) -> str:
        if pos >= len(self.text):
            self.end_of_text(pos)
        return self.text[pos]

    def expect_one_of(self, pos: int, markers: tuple[str, ...]) -> str:
        """The marker at `pos`; at the end of partial text, a prefix of one waits for more."""
        for marker in markers:
            if self.text.startswith(marker, pos):
                return marker
        rest = self.text[pos:]
        if any(marker.startswith(rest) for marker in markers):
            self.end_of_text(len(self.text))
        self.fail("expected " + " or ".join(repr(m) for m in markers), pos)

    def word(self, pos: int, pattern: re.Pattern[str], what: str) -> tuple[str, int]:
        """A name matching `pattern`; complete only once a character after it proves it ended."""
        match = pattern.match(self.text, pos)
        if match is None:
            self.peek(pos)
            self.fail(f"expected {what}", pos)
        if match.end() >= len(self.text):
            self.end_of_text(match.end())
        return match.group(), match.end()

    # -- strings --------------------------------------------------------------------------------
    def string_delimiter_at(self, pos: int) -> str | None:
        for quote in self.dialect.quotes:
            if self.text.startswith(quote, pos):
                return quote
            if len(quote) > 1 and quote.startswith(self.text[pos:]):
                self.end_of_text(pos)
        return None

    def lex_string(self, pos: int, delimiter: str) -> tuple[str, bool, int]:
        """(decoded text so far, closed, index after the closing delimiter) for the string at pos."""
        body = pos + len(delimiter)
        if delimiter == GEMMA_QUOTE:
            result = self.lex_verbatim(body, delimiter)
        elif self.dialect.python_escapes:
            result = self.lex_escaped(body, delimiter, self.python_escape)
        else:
            result = self.lex_escaped(body, delimiter, self.json_escape)
        if not result[1] and not self.partial:
            self.fail("unterminated string", pos)
        return result

    def lex_verbatim(self, pos: int, delimiter: str) -> tuple[str, bool, int]:
        close = self.text.find(delimiter, pos)
        if close >= 0:
            return self.text[pos:close], True, close + len(delimiter)
        held = held_marker_length(self.text, (delimiter,), pos)
        return self.text[pos : len(self.text) - held], False, len(self.text)

    def lex_escaped(
        self, pos: int, quote: str, escape: Callable[[int], tuple[str | None, int]]
    ) -> tuple[str, bool, int]:
        text, plain, parts = self.text, _PLAIN_RUN[quote], []
        while True:
            run = plain.match(text, pos)
            if run:
                parts.append(run.group())
                pos = run.end()
            if pos >= len(text):
                return "".join(parts), False, pos
            if text[pos] == quote:
                return "".join(parts), True, pos + 1
            decoded, after = escape(pos)
            if decoded is None:  # an escape cut off by the end of the text
                return "".join(parts), False, pos
            parts.append(decoded)
            pos = after

    def hex_digits(self, start: int, count: int, escape_pos: int) -> int | None:
        digits = self.text[start : start + count]
        if not _HEX_PREFIX.fullmatch(digits):
            self.fail("invalid hexadecimal escape", escape_pos)
        return int(digits, 16) if len(digits) == count else None

    def json_escape(self, pos: int) -> tuple[str | None, int]:
        """Decode the JSON escape at `pos` (a backslash): (text, next index), or (None, pos) if cut off."""
        text = self.text
        if pos + 1 >= len(text):
            return None, pos
        char = text[pos + 1]
        if char in _JSON_SIMPLE_ESCAPES:
            return _JSON_SIMPLE_ESCAPES[char], pos + 2
        if char != "u":
            self.fail(f"invalid escape '\\{char}'", pos)
        return self.u_escape(pos)

    def u_escape(self, pos: int) -> tuple[str | None, int]:
        """A `\\uXXXX` escape; a high surrogate pairs with a following low-surrogate escape."""
        code = self.hex_digits(pos + 2, 4, pos)
        if code is None:
            return None, pos
        if 0xD800 <= code < 0xDC00:
            tail = self.text[pos + 6 : pos + 12]
            if _LOW_SURROGATE_ESCAPE.fullmatch(tail):
                low = self.hex_digits(pos + 8, 4, pos + 6)
                return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), pos + 12
            if len(tail) < 6 and _LOW_SURROGATE_ESCAPE_PREFIX.fullmatch(tail):
                return None, pos
        return chr(code), pos + 6

    def python_escape(self, pos: int) -> tuple[str | None, int]:
        """Decode the Python escape at `pos`; unknown escapes keep their backslash, as in Python."""
        text = self.text
        if pos + 1 >= len(text):
            return None, pos
        char = text[pos + 1]
        if char in _PYTHON_SIMPLE_ESCAPES:
            return _PYTHON_SIMPLE_ESCAPES[char], pos + 2
        if char == "/" and self.dialect.slash_escape:
            return "/", pos + 2
        if char in "01234567":
            digits = _OCTAL.match(text, pos + 1).group()
            if len(digits) < 3 and pos + 1 + len(digits) >= len(text):
                return None, pos
            return chr(int(digits, 8)), pos + 1 + len(digits)
        if char == "u":  # pairs surrogates like JSON (Python would not; json.loads of the output would)
            return self.u_escape(pos)
        if char in _PYTHON_HEX_ESCAPE_DIGITS:
            count = _PYTHON_HEX_ESCAPE_DIGITS[char]
            code = self.hex_digits(pos + 2, count, pos)
            if code is None:
                return None, pos
            if code > 0x10FFFF:
                self.fail("escape beyond U+10FFFF", pos)
            return chr(code), pos + 2 + count
        if char == "N":
            return self.python_named_escape(pos)
        return "\\" + char, pos + 2

    def python_named_escape(self, pos: int) -> tuple[str | None, int]:
        text = self.text
        if pos + 2 >= len(text):
            return None, pos
        if text[pos + 2] != "{":
            self.fail("malformed \\N{...} escape", pos)
        close = text.find("}", pos + 3)
        name = text[pos + 3 : close if close >= 0 else len(text)]
        if not _UNICODE_NAME_PREFIX.fullmatch(name):
            self.fail("malformed \\N{...} escape", pos)
        if close < 0:
            return None, pos
        try:
            return unicodedata.lookup(name), close + 1
        except KeyError:
            self.fail(f"unknown character name {name!r}", pos)
