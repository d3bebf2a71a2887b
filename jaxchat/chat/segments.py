"""Small text helpers shared by the parsers: partial-marker hold-back and trimmed segment joining.

Contract: `cut_partial_marker(text, markers)` drops a tail of `text` that is a proper prefix of
one of `markers` (it may still become that marker); `Segments` collects trimmed, non-empty text
segments joined with a blank line, so trailing whitespace only shows once something follows it;
`MarkerScanner` finds the first of some markers, resuming where its last search stopped;
`StopFinder` finds where the turn ends (its first stop marker), incrementally.
"""

from __future__ import annotations

from collections.abc import Iterable

SEPARATOR = "\n\n"


def partial_marker_length(text: str, markers: Iterable[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of one of `markers`."""
    longest = 0
    for marker in markers:
        span = min(len(marker) - 1, len(text))
        if span <= longest:
            continue
        tail = text[-span:]
        i = tail.find(marker[0])
        while 0 <= i < span - longest:
            if marker.startswith(tail[i:]):
                longest = span - i
                break
            i = tail.find(marker[0], i + 1)
    return longest


def cut_partial_marker(text: str, markers: Iterable[str]) -> str:
    longest = partial_marker_length(text, markers)
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


class MarkerScanner:
    """Finds the first of some markers in `text[pos:end]`, resuming where the last search stopped."""

    def __init__(self) -> None:
        self.scan_from = 0

    def find(self, text: str, markers: tuple[str, ...], pos: int, end: int) -> tuple[int, str]:
        longest = max((len(m) for m in markers), default=1)
        start = max(pos, self.scan_from - longest + 1)
        best, found = -1, ""
        for marker in markers:
            idx = text.find(marker, start, end)
            if idx >= 0 and (best < 0 or idx < best):
                best, found = idx, marker
        self.scan_from = end if best < 0 else best
        return best, found

    def reset(self, pos: int) -> None:
        self.scan_from = pos


class StopFinder:
    """Where the turn ends: the first stop marker, found incrementally."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.scanner = MarkerScanner()
        self.stop_at: int | None = None

    def end(self, text: str) -> int:
        if self.stop_at is None and self.stops:
            idx, _ = self.scanner.find(text, self.stops, 0, len(text))
            if idx >= 0:
                self.stop_at = idx
        return len(text) if self.stop_at is None else self.stop_at
