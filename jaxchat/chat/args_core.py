"""The shared, prefix-stable value converter behind every tool-call argument dialect.

Contract: `convert_value(text, dialect, partial)` reads one value at the start of `text` written in
a `Dialect` (see `args_lexer.py`) and returns its canonical JSON text: `{"k": v, "k2": v2}` /
`[a, b]`, no other whitespace, non-ASCII kept, strings escaped only where JSON requires it.
With `partial=True` the text may stop anywhere; the output is then everything that is already
certain, so it is a prefix of the output for any longer text:
  - strings stream as they arrive (the lexer holds back incomplete escapes and delimiters);
  - numbers and literals (`true`, `None`, ...) are held until a delimiter proves they ended;
  - an object key appears, together with `": "`, only once the key and its colon are complete;
  - `, ` appears only once the next element has started, so a trailing comma never leaks.
`ValueConverter` exposes its reading primitives so that the call-level parsers in `args.py` and
`args_xml.py` are thin walkers over the same code. Stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from jaxchat.chat.args_lexer import (
    GEMMA,
    JSON,
    PYTHON,
    RELAXED,
    ArgumentSyntaxError,
    Dialect,
    Lexer,
    NeedMoreText,
    held_marker_length,
    json_escape,
    json_quote,
)

__all__ = [  # the lexer's names are re-exported for the call-level parsers
    "GEMMA", "JSON", "PYTHON", "RELAXED", "ArgumentSyntaxError", "Dialect", "NeedMoreText", "ParsedCall",
    "ValueConverter", "convert_value", "held_marker_length", "json_escape", "json_quote", "python_number_json",
]


@dataclass(frozen=True)
class ParsedCall:
    name: str | None  # None until the function name is completely known
    arguments: str  # canonical JSON text so far ("" before anything is known)
    complete: bool  # the call's syntax is closed
    end: int  # index in the body just after this call's syntax (len(body) when not complete)


MAX_DEPTH = 128

_SCALAR_TOKEN = re.compile(r"[-+]?[0-9A-Za-z_.]*(?:(?<=[eE])[-+][0-9A-Za-z_.]*)?")
_JSON_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
_JSON_NUMBER_PREFIX = re.compile(r"-?(?:(?:0|[1-9]\d*)(?:\.(?:\d+(?:[eE][-+]?\d*)?)?|[eE][-+]?\d*)?)?")
_PY_INT = re.compile(r"[-+]?(?:0[xX][\da-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|\d[\d_]*)")
_PY_FLOAT = re.compile(r"[-+]?(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][-+]?\d[\d_]*)?")
_PY_NUMBER_PREFIX = re.compile(
    r"[-+]?(?:0[xX][\da-fA-F_]*|0[oO][0-7_]*|0[bB][01_]*|(?:\d[\d_]*\.?[\d_]*|\.[\d_]*)(?:[eE][-+]?[\d_]*)?)?"
)
_BARE_KEY = re.compile(r"[^\s:{}\[\],\"'<>=]+")
_IDENTIFIER = re.compile(r"[^\W\d]\w*")


def python_number_json(token: str) -> str | None:
    """JSON text for a Python int/float literal (underscores, hex, `.5`), or None if it is not one."""
    try:
        if _PY_INT.fullmatch(token):
            return str(int(token, 0))
        if _PY_FLOAT.fullmatch(token):
            number = float(token)
            return repr(number) if number not in (float("inf"), float("-inf")) else None
    except ValueError:
        return None
    return None


class ValueConverter(Lexer):
    """Reads dialect values from `text`, appending canonical JSON to `self.out`."""

    def __init__(self, text: str, dialect: Dialect, partial: bool, base: int = 0) -> None:
        super().__init__(text, dialect, partial, base)
        self.out: list[str] = []
        self.depth = 0

    def emit(self, piece: str) -> None:
        self.out.append(piece)

    def output(self) -> str:
        return "".join(self.out)

    # -- values ---------------------------------------------------------------------------------
    def value(self, pos: int) -> int:
        """Read one value at `pos` (after optional whitespace); returns the index after it."""
        pos = self.ws(pos)
        char = self.peek(pos)
        if char == "{":
            self.emit("{")
            return self.members(pos + 1, "}", self.key, ":")
        if char == "[":
            return self.array(pos, "]")
        if char == "(" and self.dialect.tuples:
            return self.array(pos, ")")
        delimiter = self.string_delimiter_at(pos)
        if delimiter is not None:
            return self.string_value(pos, delimiter)
        return self.scalar(pos)

    def members(self, pos: int, closer: str, read_key: Callable[[int], tuple[str, int]], colon: str) -> int:
        """Object members after an already emitted `{`, through `closer`."""
        self.enter(pos)
        pos = self.ws(pos)
        if self.peek(pos) == closer:
            return self.close("}", pos)
        first = True
        while True:
            key, pos = read_key(pos)
            pos = self.ws(pos)
            if self.peek(pos) != colon:
                self.fail(f"expected {colon!r} after key {key!r}", pos)
            self.emit(("" if first else ", ") + json_quote(key) + ": ")
            pos = self.ws(self.value(pos + 1))
            if self.after_element(pos, closer):
                return self.close("}", pos)
            pos = self.ws(pos + 1)
            if self.dialect.trailing_commas and self.peek(pos) == closer:
                return self.close("}", pos)
            first = False

    def array(self, pos: int, closer: str) -> int:
        self.emit("[")
        self.enter(pos)
        pos = self.ws(pos + 1)
        if self.peek(pos) == closer:
            return self.close("]", pos)
        while True:
            pos = self.ws(self.value(pos))
            if self.after_element(pos, closer):
                return self.close("]", pos)
            pos = self.ws(pos + 1)
            if self.peek(pos) == closer and self.dialect.trailing_commas:
                return self.close("]", pos)
            self.emit(", ")  # only now: the next element has started

    def after_element(self, pos: int, closer: str) -> bool:
        """True at `closer`; at a comma False; anything else is an error."""
        char = self.peek(pos)
        if char == closer:
            return True
        if char != ",":
            self.fail(f"expected ',' or {closer!r}", pos)
        return False

    def enter(self, pos: int) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self.fail(f"nesting deeper than {MAX_DEPTH}", pos)

    def close(self, bracket: str, pos: int) -> int:
        self.depth -= 1
        self.emit(bracket)
        return pos + 1

    def scalar(self, pos: int) -> int:
        """A number or literal; held back until a delimiter (or the end of complete text) follows."""
        match = _SCALAR_TOKEN.match(self.text, pos)
        token = match.group()
        if not token:
            self.fail(f"unexpected character {self.text[pos]!r}", pos)
        if match.end() >= len(self.text) and self.partial:
            if not self.could_become_scalar(token):
                self.fail(f"invalid value {token!r}", pos)
            raise NeedMoreText
        json_text = self.scalar_json(token)
        if json_text is None:
            self.fail(f"invalid value {token!r}", pos)
        self.emit(json_text)
        return match.end()

    def scalar_json(self, token: str) -> str | None:
        if token in self.dialect.literals:
            return self.dialect.literals[token]
        if _JSON_NUMBER.fullmatch(token):
            return token
        return python_number_json(token) if self.dialect.python_numbers else None

    def could_become_scalar(self, token: str) -> bool:
        if any(literal.startswith(token) for literal in self.dialect.literals):
            return True
        if _JSON_NUMBER_PREFIX.fullmatch(token):
            return True
        return self.dialect.python_numbers and _PY_NUMBER_PREFIX.fullmatch(token) is not None

    def string_value(self, pos: int, delimiter: str) -> int:
        decoded, closed, end = self.lex_string(pos, delimiter)
        self.emit('"' + json_escape(decoded) + ('"' if closed else ""))
        if not closed:
            raise NeedMoreText
        return end

    # -- keys -----------------------------------------------------------------------------------
    def key(self, pos: int) -> tuple[str, int]:
        """An object key: a complete string (or bare word in Gemma); never partially emitted."""
        self.peek(pos)
        delimiter = self.string_delimiter_at(pos)
        if delimiter is not None:
            decoded, closed, end = self.lex_string(pos, delimiter)
            if not closed:
                raise NeedMoreText
            return decoded, end
        if self.dialect.bare_keys:
            return self.word(pos, _BARE_KEY, "a key")
        self.fail("expected a string key", pos)

    def identifier_key(self, pos: int) -> tuple[str, int]:
        """A Python keyword-argument name."""
        return self.word(pos, _IDENTIFIER, "a keyword argument name")


def convert_value(text: str, dialect: Dialect, partial: bool, base: int = 0) -> tuple[str, bool, int]:
    """(canonical JSON so far, complete, end) for the value at the start of `text`."""
    converter = ValueConverter(text, dialect, partial, base)
    try:
        end = converter.value(0)
    except NeedMoreText:
        return converter.output(), False, len(text)
    return converter.output(), True, end
