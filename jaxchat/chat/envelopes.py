"""Call envelopes: tool calls that models write as fenced or bare JSON in a reply's content.

Contract: for a spec with `spec.envelopes` (the JSON-call kinds, `chat.spec.ENVELOPES`) and a parse
with `ChatParseOptions.call_envelopes`, an *envelope* may begin where a content line begins (the start
of a content segment, or after a newline; then spaces or tabs):
  - "fenced": a Markdown fence, "```" with an optional language tag and a newline, holding call
    objects separated by whitespace or one array of call objects, closed by "```";
  - "bare": one call object, or an array of call objects.
A call object is `{`, whitespace, one of `ENVELOPE_NAME_KEYS` written exactly, a declared tool's name
written without escapes and its closing quote (exactly the text the grammar triggers on,
`constrain.tags_envelopes`), then `,` `"arguments"` or `"parameters"` `:` an object, and `}`
(whitespace allowed between these).

`read_envelope(body, names, partial)` reads the envelope at the start of `body` (tool names `names`)
and returns an `EnvelopeRead`:
  - `rejected`: it is not an envelope of calls (its first call object is not one): its text is content;
  - `end` set: it closed there (after its closing fence or bracket, or after its last complete call
    when what follows is not another call); the text after it is content again;
  - neither: it is open. `calls` are the calls decided so far (the last may be incomplete; none while
    the opening is undecided) and the text from the envelope's start is held back from the content.
A call is decided once its arguments object opens; then its name and arguments stream as a native
call's do (canonical JSON, prefix-stable, `chat.args_core`), and a complete call is final. With
`partial=False` an opening cut by the end of the text is rejected and an incomplete call is dropped:
the envelope ends after its last complete call, or is rejected when it has none (the cut-call rule).
`EnvelopeScanner` finds where envelopes may begin, incrementally. `call_envelopes_on(spec, request)`
says whether a request's reply reads envelopes (a spec with envelopes, callable tools, a text
response_format): the service sets the parse option from it and the grammar adds its triggers.
`native_call_opening(spec, name)` is the format's own text that opens a call of `name` up to its arguments
object, where a reply may open with it (hermes_json: `<tool_call>\n{"name": "NAME", "arguments": `, the begin
of its grammar tag), or None: what a reply that opens with an envelope is restarted from
(`jaxchat.api.envelope_restart`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from jaxchat.chat.args_core import JSON, ArgumentSyntaxError, NeedMoreText, ParsedCall, ValueConverter
from jaxchat.chat.msg import ChatParseOptions
from jaxchat.chat.request import ConstraintRequest
from jaxchat.chat.spec import ENVELOPE_ARGUMENT_KEYS, ENVELOPE_NAME_KEYS, ChatFormatSpec

__all__ = ["EnvelopeRead", "EnvelopeScanner", "call_envelopes_on", "native_call_opening", "read_envelope"]

FENCE = "```"
_WHITESPACE = " \t\r\n"
_LANGUAGE = re.compile(r"[ \t]*[A-Za-z0-9_+.\-]*[ \t]*")
_NAME = re.compile(r"[A-Za-z0-9_\-]*")
_QUOTED_KEYS = tuple(f'"{k}"' for k in ENVELOPE_ARGUMENT_KEYS)
_LINE_BREAKS = ("\n", "\r\n")


def call_envelopes_on(spec: ChatFormatSpec, request: ConstraintRequest) -> bool:
    """Whether the reply to `request` reads call envelopes: tools are callable (any tool_choice but "none")
    and the content is text. The grammar constrains them under "auto"; under "required" or a named tool it
    admits only the native syntax, so only an unconstrained reply can hold one there."""
    return bool(spec.envelopes) and bool(request.callable_tools) and request.response_format == "text"


def native_call_opening(spec: ChatFormatSpec, name: str) -> str | None:
    """The format's own opening of a call of `name`, up to its arguments object (see the module contract)."""
    if spec.kind == "hermes_json":
        return f'{spec.tool_start}\n{{"name": {json.dumps(name)}, "arguments": '
    return None


@dataclass(frozen=True)
class EnvelopeRead:
    calls: tuple[ParsedCall, ...] = ()
    end: int | None = None  # index in the body after the envelope, once it closed
    rejected: bool = False


class _End(Exception):
    """The text ends before the envelope is decided or closed."""


class _NotACall(Exception):
    """What follows cannot be (a prefix of) the envelope's syntax."""


class _Reader:
    def __init__(self, body: str, names: frozenset[str]) -> None:
        self.body = body
        self.names = names
        self.converter = ValueConverter(body, JSON, partial=True)
        self.calls: list[ParsedCall] = []
        self.commit = 0  # after the last complete call (or the closing bracket)

    def ws(self, pos: int) -> int:
        body = self.body
        while pos < len(body) and body[pos] in _WHITESPACE:
            pos += 1
        return pos

    def peek(self, pos: int) -> str:
        if pos >= len(self.body):
            raise _End
        return self.body[pos]

    def literal(self, pos: int, options: tuple[str, ...]) -> int:
        """The index after whichever of `options` is at `pos`; _End when the text stops inside one."""
        for option in options:
            if self.body.startswith(option, pos):
                return pos + len(option)
        rest = self.body[pos:]
        if any(option.startswith(rest) for option in options):
            raise _End
        raise _NotACall

    def read(self) -> int:
        """The end of the envelope; raises _End or _NotACall."""
        fenced = self.body.startswith("`")
        pos = 0
        if fenced:
            pos = self.literal(0, (FENCE,))
            pos = self.literal(_LANGUAGE.match(self.body, pos).end(), _LINE_BREAKS)
            pos = self.ws(pos)
        array = self.peek(pos) == "["
        if array:
            pos = self.ws(pos + 1)
        pos = self.call(pos)
        while True:
            self.commit = pos
            if not (fenced or array):
                return pos
            pos = self.ws(pos)
            char = self.peek(pos)
            if array:
                if char == ",":
                    pos = self.call(self.ws(pos + 1))
                    continue
                if char != "]":
                    raise _NotACall
                self.commit = pos = pos + 1
                if not fenced:
                    return pos
                return self.literal(self.ws(pos), (FENCE,))
            if char == "{":
                pos = self.call(pos)
                continue
            return self.literal(pos, (FENCE,))

    def call(self, pos: int) -> int:
        """Read the call object at `pos`; returns the index after it."""
        body = self.body
        if self.peek(pos) != "{":
            raise _NotACall
        pos = self.literal(self.ws(pos + 1), ENVELOPE_NAME_KEYS)
        name = _NAME.match(body, pos).group()
        pos += len(name)
        if pos >= len(body):
            if any(n.startswith(name) for n in self.names):
                raise _End
            raise _NotACall
        if body[pos] != '"' or name not in self.names:
            raise _NotACall
        pos = self.literal(self.ws(pos + 1), (",",))
        pos = self.literal(self.ws(pos), _QUOTED_KEYS)
        pos = self.ws(self.literal(self.ws(pos), (":",)))
        if self.peek(pos) != "{":
            raise _NotACall
        converter = self.converter
        converter.out = []
        try:
            end = self.ws(converter.value(pos))
            if end >= len(body):
                raise NeedMoreText
        except NeedMoreText:
            self.calls.append(ParsedCall(name, converter.output(), False, len(body)))
            raise _End from None
        except ArgumentSyntaxError:
            raise _NotACall from None
        if body[end] != "}":
            raise _NotACall
        self.calls.append(ParsedCall(name, converter.output(), True, end + 1))
        return end + 1


def read_envelope(body: str, names: frozenset[str], partial: bool) -> EnvelopeRead:
    """The envelope at the start of `body` (see the module contract)."""
    reader = _Reader(body, names)
    try:
        end = reader.read()
        return EnvelopeRead(tuple(reader.calls), end)
    except _End:
        if partial:
            return EnvelopeRead(tuple(reader.calls))
        complete = tuple(c for c in reader.calls if c.complete)
    except _NotACall:
        complete = tuple(reader.calls)
    return EnvelopeRead(complete, reader.commit) if complete else EnvelopeRead(rejected=True)


class EnvelopeScanner:
    """Where envelopes may begin in a parse's content, found incrementally (`scan_from` moves forward)."""

    def __init__(self, spec: ChatFormatSpec, options: ChatParseOptions) -> None:
        on = bool(spec.envelopes) and options.call_envelopes and options.parse_tool_calls
        self.names = options.tool_names() if on else frozenset()
        self.on = bool(self.names)
        self.starts = ("`" if "fenced" in spec.envelopes else "") + ("{[" if "bare" in spec.envelopes else "")
        self.scan_from = 0

    def reset(self, pos: int) -> None:
        self.scan_from = pos

    def find(self, text: str, segment: int, limit: int) -> int:
        """The first place in text[segment:limit] at or after `scan_from` where an envelope may begin
        (its first character, at the start of a line), or -1."""
        pos = max(self.scan_from, segment)
        while pos < limit:
            if pos != segment and text[pos - 1] != "\n":
                newline = text.find("\n", pos, limit)
                if newline < 0:
                    break
                pos = newline + 1
                continue
            first = pos
            while first < limit and text[first] in " \t":
                first += 1
            if first >= limit:
                self.scan_from = pos  # a blank line so far: look at it again when it goes on
                return -1
            if text[first] in self.starts:
                self.scan_from = pos
                return first
            pos = first + 1
        self.scan_from = max(self.scan_from, min(pos, limit))
        return -1
