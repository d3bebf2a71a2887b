"""`RequestError` and the field checks every request reader shares.

Contract: each check returns the checked (and, where stated, defaulted) value or raises
`RequestError(param, message)` (optionally with a `code`), which the server answers with HTTP 400. `param` is the path of the
offending field spelled the way the OpenAI API spells it (`tools[2].function.name`, `stop[1]`); the
message says what was expected and what arrived (`got`). A value of None reads as absent. Booleans
never pass as numbers, and numbers must be finite. Stdlib only: this is the leaf that the chat
library's constraint reader and `jaxchat.api`'s request readers both import.
"""

from __future__ import annotations

import math
import re

NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")


class RequestError(ValueError):
    """A request the server must answer with HTTP 400 (`code`: the error body's machine-readable code, if any)."""

    def __init__(self, param: str | None, message: str, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.message = message
        self.code = code


def got(value: object) -> str:
    """Describe a received value for an error message: `string 'x'`, `number 3`, `an array` ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {'true' if value else 'false'}"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {shown!r}"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def expect_object(value: object, param: str, what: str = "an object") -> dict:
    if not isinstance(value, dict):
        raise RequestError(param, f"expected {what}, got {got(value)}")
    return value


def expect_bool(value: object, param: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(param, f"expected a boolean (true or false), got {got(value)}")
    return value


def _present(value: object, param: str, kind: type, missing: str, expected: str):
    """`value` when it is there and a `kind`; else a 400 saying what is missing or what was expected."""
    if value is None:
        raise RequestError(param, f"missing required field: {missing}")
    if not isinstance(value, kind):
        raise RequestError(param, f"expected {expected}, got {got(value)}")
    return value


def expect_name(value: object, param: str, what: str) -> str:
    value = _present(value, param, str, f"the {what}", f"the {what} as a string")
    if not NAME_RE.fullmatch(value):
        raise RequestError(param, f"invalid {what} {value!r}: use 1 to 64 characters from a-z, A-Z, 0-9, '_' and '-'")
    return value


def expect_items(value: object, param: str, what: str) -> list:
    """A JSON array of at least one item; `what` names the items in the messages ("tool references")."""
    value = _present(value, param, list, f"a non-empty array of {what}", f"an array of {what}")
    if not value:
        raise RequestError(param, f"expected at least one of the {what}, got an empty array")
    return value


def expect_str(value: object, param: str, default: str | None = None) -> str | None:
    if value is None:
        return default
    if not isinstance(value, str):
        raise RequestError(param, f"expected a string, got {got(value)}")
    return value


def expect_int(value: object, param: str, lo: int, hi: int | None, default: int | None = None,
               what: str = "") -> int | None:
    """An integer in lo..hi (hi None: unbounded); `what` is appended to the range in the message."""
    if value is None:
        return default
    if not is_int(value):
        raise RequestError(param, f"expected an integer, got {got(value)}")
    if value < lo or (hi is not None and value > hi):
        bound = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise RequestError(param, f"{param} must be {bound}{what}, got {value}")
    return value


def expect_number(value: object, param: str, lo: float, hi: float | None, default: float | None = None,
                  lo_open: bool = False) -> float | None:
    """A finite number in [lo, hi] ((lo, hi] with `lo_open`; hi None: unbounded)."""
    if value is None:
        return default
    if not is_number(value):
        raise RequestError(param, f"expected a finite number, got {got(value)}")
    too_low = value <= lo if lo_open else value < lo
    if too_low or (hi is not None and value > hi):
        low = f"greater than {lo}" if lo_open else f"at least {lo}"
        bound = low if hi is None else f"{low} and at most {hi}"
        raise RequestError(param, f"{param} must be {bound}, got {value}")
    return float(value)
