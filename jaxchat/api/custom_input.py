"""A custom tool call's input, read from its JSON arguments whole or as they stream in.

Contract: a custom call's arguments are the parser's canonical JSON `{"input": "<the input, JSON-escaped>"}`.
`custom_input(arguments)` is its input: when the arguments open with `{"input": "`, the decoded text of that
string, whole or as far as it goes (a cut output keeps the input written so far; an escape that is not complete
is left out); otherwise the `input` string of the arguments as JSON, or, when they are no such object (an
unconstrained decode may write anything), the arguments themselves. `CustomInput()` reads the same input
incrementally: `feed(piece)` takes the next piece of the arguments and returns the input text it adds (only while
the arguments open as above: otherwise nothing until the end); `finish()` returns the rest. The pieces it returns
concatenate to `custom_input` of the whole arguments, so a streamed custom call equals the non-streamed one. Stdlib only.
"""

from __future__ import annotations

import json
import re

__all__ = ["CustomInput", "custom_input"]

HEAD = '{"input": "'
_BODY = re.compile(r'(?:[^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*')
_HIGH_SURROGATE_END = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}$")


def _decoded(arguments: str) -> str | None:
    """The decoded text of the string after HEAD, as far as it is complete; None when the arguments do not
    open with HEAD (nor could yet: a prefix of HEAD is "")."""
    if not arguments.startswith(HEAD):
        return "" if HEAD.startswith(arguments) else None
    body = _BODY.match(arguments, len(HEAD)).group()
    closed = arguments[len(HEAD) + len(body):].startswith('"')
    if not closed and _HIGH_SURROGATE_END.search(body):  # its low half may follow
        body = body[:-6]
    return json.loads('"' + body + '"')


def custom_input(arguments: str) -> str:
    text = _decoded(arguments)
    if text is not None and arguments.startswith(HEAD):
        return text
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value["input"] if isinstance(value, dict) and isinstance(value.get("input"), str) else arguments


class CustomInput:
    def __init__(self) -> None:
        self.arguments = ""
        self.sent = ""

    def feed(self, piece: str) -> str:
        self.arguments += piece
        text = _decoded(self.arguments)
        if text is None or not text.startswith(self.sent):
            return ""
        new, self.sent = text[len(self.sent):], text
        return new

    def finish(self) -> str:
        whole = custom_input(self.arguments)
        assert whole.startswith(self.sent), (whole, self.sent)  # what was sent is a prefix of the input
        rest, self.sent = whole[len(self.sent):], whole
        return rest
