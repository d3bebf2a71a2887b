"""Small text helpers shared by the parsers: partial-marker hold-back and trimmed segment joining.

Contract: `cut_partial_marker(text, markers)` drops a tail of `text` that is a proper prefix of
one of `markers` (it may still become that marker); `Segments` collects trimmed, non-empty text
segments joined with a blank line, so trailing whitespace only shows once something follows it.
"""

from __future__ import annotations

from typing import Iterable

SEPARATOR = "\n\n"


def cut_partial_marker(text: str, markers: Iterable[str]) -> str:
    longest = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:k]):
                longest = k
                break
    return text[: len(text) - longest] if longest else text


def join_segment(joined: str, segment: str) -> str:
    """`joined` followed by the trimmed `segment` (nothing when it is blank)."""
    segment = segment.strip()
    if not segment:
        return joined
    return f"{joined}{SEPARATOR}{segment}" if joined else segment


class Segments:
    """Trimmed segments of closed regions, joined once as they close."""

    def __init__(self) -> None:
        self.joined = ""

    def add(self, segment: str) -> None:
        self.joined = join_segment(self.joined, segment)

    def with_open(self, segment: str) -> str:
        return join_segment(self.joined, segment)
