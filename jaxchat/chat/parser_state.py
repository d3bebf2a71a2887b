"""What every resumable parser of an assistant turn keeps between calls of its `parse`.

Contract: `ParserState(spec, options)` holds the closed regions read so far — joined content and
reasoning segments, finished tool calls — the resume position and the marker scanner;
`closed_calls` is how many leading calls of every later parse are final (`ChatStream` settles them).
`MarkerParser` adds what the marker-driven formats share: whether tool calls are parsed
(`tools_on`), the openers that leave plain content (reasoning start, tool opener) and the turn's
stop markers (`stops`), starting in the content region.
"""

from __future__ import annotations

from jaxchat.chat.msg import ChatParseOptions, ToolCall
from jaxchat.chat.segments import MarkerScanner, Segments, StopFinder
from jaxchat.chat.spec import ChatFormatSpec

__all__ = ["CONTENT", "MarkerParser", "ParserState"]

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
