"""An EBNF grammar over raw text, rewritten to match the same texts written inside a JSON string.

Contract: `json_string_ebnf(ebnf, root="root") -> str` returns an EBNF grammar (its rules renamed with the prefix
`root`'s new name, so it can sit inside another grammar) whose language is `{escape(s) : s in L(ebnf)}`, where
`escape` is the JSON string escaping `json.dumps` writes without `ensure_ascii`: `"` and `\\` backslashed,
`\\n \\t \\r \\b \\f` short, other control characters `\\u00XX`, everything else as itself. So a custom tool's
input grammar constrains the input inside a JSON-call format's `"input": "..."`, and decoding that JSON string
gives back a text of the original grammar. Handles the EBNF that `lark_ebnf` and xgrammar's regex converter
write: rules, string literals, character classes (negated too), groups, `| * + ?`, `{m,n}`. `ValueError` for
anything else (it is never silently passed through).
"""

from __future__ import annotations

import re

from jaxchat.constrain.output import literal

__all__ = ["json_string_ebnf"]

_SHORT = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}
_UNSAFE = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "b": "\b", "0": "\0", "a": "\a", "e": "\x1b"}
_TOKEN = re.compile(r'\s+|::=|"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z_][A-Za-z0-9_.\-]*|\{\s*\d*\s*(?:,\s*\d*\s*)?\}|[()|*+?]')


def _escape(ch: str) -> str:
    return _SHORT.get(ch) or (f"\\u{ord(ch):04x}" if ord(ch) < 0x20 else ch)


def _unescape(body: str) -> list[str]:
    """The characters of a literal's or class's body, escapes decoded (kept as "\\x" pairs for `-`, `]`, `^`)."""
    out, i = [], 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[nxt]
            out.append(chr(int(body[i + 2:i + 2 + width], 16)))
            i += 2 + width
        else:
            out.append(_ESCAPES.get(nxt, "\\" + nxt if nxt in "-]^[" else nxt))
            i += 2
    return out


def _class_ranges(body: str) -> tuple[bool, list[tuple[int, int]]]:
    negated = body.startswith("^")
    chars = _unescape(body[1:] if negated else body)
    items = [c[1] if len(c) == 2 else c for c in chars]
    literal_dash = [len(c) == 2 for c in chars]
    ranges, i = [], 0
    while i < len(items):
        if i + 2 < len(items) and items[i + 1] == "-" and not literal_dash[i + 1]:
            ranges.append((ord(items[i]), ord(items[i + 2])))
            i += 3
        else:
            ranges.append((ord(items[i]), ord(items[i])))
            i += 1
    return negated, ranges


def _class_text(ranges, negated: bool) -> str:
    def one(cp: int) -> str:
        ch = chr(cp)
        return "\\" + ch if ch in "\\]-^[" else f"\\u{cp:04x}" if cp < 0x20 else ch

    inner = "".join(one(lo) if lo == hi else f"{one(lo)}-{one(hi)}" for lo, hi in ranges)
    return f"[{'^' if negated else ''}{inner}]"


def _minus(ranges, cut) -> list[tuple[int, int]]:
    out = list(ranges)
    for clo, chi in cut:
        nxt = []
        for lo, hi in out:
            if hi < clo or lo > chi:
                nxt.append((lo, hi))
                continue
            if lo < clo:
                nxt.append((lo, clo - 1))
            if hi > chi:
                nxt.append((chi + 1, hi))
        out = nxt
    return out


def _json_class(body: str) -> str:
    negated, ranges = _class_ranges(body)
    inside = lambda cp: any(lo <= cp <= hi for lo, hi in ranges)  # noqa: E731
    unsafe = [cp for lo, hi in _UNSAFE for cp in range(lo, hi + 1) if inside(cp) != negated]
    alts = []
    if negated:
        alts.append(_class_text(ranges + _UNSAFE, True))
    else:
        safe = _minus(ranges, _UNSAFE)
        if safe:
            alts.append(_class_text(safe, False))
    alts += [literal(_escape(chr(cp))) for cp in unsafe]
    if not alts:
        return '("" "")'  # cannot happen for a non-empty class; keeps the grammar well-formed
    return alts[0] if len(alts) == 1 else "(" + " | ".join(alts) + ")"


def json_string_ebnf(ebnf: str, root: str = "root") -> str:
    out, at = [], 0
    for m in _TOKEN.finditer(ebnf):
        if m.start() != at:
            raise ValueError(f"cannot read the grammar at {ebnf[at:at + 20]!r}")
        tok, at = m.group(), m.end()
        if tok.startswith('"'):
            out.append(literal("".join(_escape(c[-1] if len(c) == 2 else c) for c in _unescape(tok[1:-1]))))
        elif tok.startswith("["):
            out.append(_json_class(tok[1:-1]))
        elif re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.\-]*", tok):
            out.append(re.sub(r"^root(?=$|_)", root, tok) if root != "root" else tok)
        else:
            out.append(tok)
    if at != len(ebnf):
        raise ValueError(f"cannot read the grammar at {ebnf[at:at + 20]!r}")
    return "".join(out)
