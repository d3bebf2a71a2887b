"""What every resumable parser of an assistant turn keeps between calls of its `parse`.

Contract: `ParserState(spec, options)` holds the closed regions read so far — joined content and
reasoning segments, finished tool calls — the resume position and the marker scanner;
`closed_calls` is how many leading calls of every later parse are final (`ChatStream` settles them).
`MarkerParser` adds what the marker-driven formats share: whether tool calls are parsed
(`tools_on`), the openers that leave plain content (reasoning start, tool opener) and the turn's
stop markers (`stops`), starting in the content region; and call envelopes in the content
(`chat.envelopes`): `next_envelope` finds the first one that is open or closed in a content segment
(skipping the ones that prove to be text), `build_open_envelope` shows the one a parse ends in.
"""

from __future__ import annotations

from collections.abc import Iterable

from jaxchat.chat.args_core import ParsedCall
from jaxchat.chat.envelopes import EnvelopeRead, EnvelopeScanner, read_envelope
from jaxchat.chat.msg import ChatMsg, ChatParseOptions, ToolCall
from jaxchat.chat.segments import MarkerScanner, Segments, StopFinder, join_segment
from jaxchat.chat.spec import ChatFormatSpec

__all__ = ["CONTENT", "MarkerParser", "ParserState", "named_calls"]

CONTENT = "content"


class ParserState:
    def __init__(self, spec: ChatFormatSpec, options: ChatParseOptions) -> None:
        self.spec = spec
        self.options = options
        self.scanner = MarkerScanner()
        self.pos = 0
        self.content = Segments()
        self.reasoning = Segments()
        self.calls: list[ToolCall] = []

    @property
    def closed_calls(self) -> int:
        """How many leading calls of every later parse are final."""
        return len(self.calls)


class MarkerParser(ParserState):
    def __init__(self, spec: ChatFormatSpec, options: ChatParseOptions) -> None:
        super().__init__(spec, options)
        self.tools_on = options.parse_tool_calls and spec.has_tools and bool(spec.tool_start)
        openers = [spec.reasoning_start] if spec.reasoning and spec.reasoning_start else []
        if self.tools_on:
            openers.append(spec.tool_start)
        self.openers = tuple(openers)
        self.stops = StopFinder(spec.stop_markers)
        self.region = CONTENT
        self.envelopes = EnvelopeScanner(spec, options)
        self.open_envelope: int | None = None  # where the envelope the last advance stopped in begins

    def next_envelope(self, text: str, segment: int, limit: int, end: int) -> tuple[int, EnvelopeRead] | None:
        """The first envelope that begins in the content text[segment:limit] and is open or closed (read
        from text[start:end]), as (start, read); rejected ones are text and skipped. None when none is."""
        while self.envelopes.on:
            start = self.envelopes.find(text, segment, limit)
            if start < 0:
                return None
            read = read_envelope(text[start:end], self.envelopes.names, partial=True)
            if not read.rejected:
                return start, read
            self.envelopes.reset(start + 1)
        return None

    def build_open_envelope(self, msg: ChatMsg, text: str, segment: int, end: int, partial: bool) -> None:
        """`msg`'s content and calls when the text ends in the envelope at `open_envelope` (content
        segment from `segment`): its decided calls; with `partial=False`, the cut-call rule."""
        start = self.open_envelope
        read = read_envelope(text[start:end], self.envelopes.names, partial)
        if read.rejected:
            msg.content = self.content.with_open(text[segment:end])
            return
        msg.content = self.content.with_open(text[segment:start])
        msg.tool_calls.extend(named_calls(read.calls))
        if read.end is not None:
            msg.content = join_segment(msg.content, text[start + read.end:end])


def named_calls(calls: Iterable[ParsedCall]) -> list[ToolCall]:
    """The calls whose names are known, as `ToolCall`s."""
    return [ToolCall(c.name, c.arguments) for c in calls if c.name is not None]
