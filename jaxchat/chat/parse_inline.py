"""The parser of formats whose tool calls end with their own syntax: `llama3_json` and `mistral`.

Contract: same as `chat.parse` (resumable, prefix-stable; a final text cut inside a call keeps the
raw call text in `content`). There is no closing marker: a call block opens at the tool opener
(`<|python_tag|>`, `[TOOL_CALLS]`) and closes where its JSON closes (`chat.args_json_calls`); text
after it is content again. Llama 3 also writes bare calls: a JSON object at the very start of the
content is a call when its first keys are `"name"` then `"parameters"` (else it is content), and after
a call `;` may join another. After `<|python_tag|>`, anything but a JSON call (Llama's built-in code
calls) is kept as text in `content`, the tag included. Text that cannot be a call is content.
Reasoning blocks (`[THINK]...[/THINK]`, `<think>...</think>`) and call envelopes (`chat.envelopes`,
with `ChatParseOptions.call_envelopes`; a native bare call opening the content comes first) are read
as in `chat.parse`.
"""

from __future__ import annotations

from jaxchat.chat.args_core import ArgumentSyntaxError, ParsedCall
from jaxchat.chat.args_json_calls import parse_llama_call, parse_mistral_call
from jaxchat.chat.msg import ChatMsg, ChatParseOptions, ToolCall
from jaxchat.chat.parser_state import CONTENT, MarkerParser, named_calls
from jaxchat.chat.segments import cut_partial_marker, join_segment
from jaxchat.chat.spec import ChatFormatSpec

_CONTENT, _REASONING, _CALL = CONTENT, "reasoning", "call"
_WHITESPACE = " \t\r\n"
# Where a bare Llama call may begin: at the start of the content, or after a call and a `;`.
_AT_START, _AFTER_CALL = "start", "after_call"


def _skip_ws(text: str, pos: int, end: int) -> int:
    while pos < end and text[pos] in _WHITESPACE:
        pos += 1
    return pos


class InlineCallParser(MarkerParser):
    def __init__(self, spec: ChatFormatSpec, options: ChatParseOptions) -> None:
        super().__init__(spec, options)
        self.start = 0  # where the open region's text starts (a call block: its opener)
        self.pos = 0  # where reading resumes (a call block: its body, after the opener)
        self.bare = _AT_START if self.tools_on and spec.kind == "llama3_json" else None
        self.bare_pending = False  # only whitespace (and a `;`) since `bare` was set: a call may follow

    def parse(self, text: str, is_partial: bool) -> ChatMsg:
        end = self.stops.end(text)
        self._advance(text, end)
        return self._build(text, end, is_partial and end == len(text))

    # -- closed regions ---------------------------------------------------------------------------
    def _advance(self, text: str, end: int) -> None:
        self.open_envelope = None
        while True:
            if self.region == _CONTENT:
                if self.bare is not None and not self._bare_call(text, end):
                    return
                if self.region == _CALL:
                    continue
                idx, marker = self.scanner.find(text, self.openers, self.pos, end)
                if self._envelope(text, idx if idx >= 0 else end, end):
                    if self.open_envelope is not None:
                        return
                    continue
                if idx < 0:
                    return
                self.content.add(text[self.start: idx])
                after = idx + len(marker)
                if marker == self.spec.reasoning_start:
                    self.region, self.start, self.pos = _REASONING, after, after
                else:
                    self.region, self.start, self.pos = _CALL, idx, after
                self.scanner.reset(after)
            elif self.region == _REASONING:
                idx, marker = self.scanner.find(text, (self.spec.reasoning_end,), self.pos, end)
                if idx < 0:
                    return
                self.reasoning.add(text[self.start: idx])
                self._to_content(idx + len(marker), idx + len(marker))
                if self.tools_on and self.spec.kind == "llama3_json" and not (self.content.joined or self.calls):
                    self.bare = _AT_START  # the content starts after the reasoning block
            elif not self._close_call(text, end):
                return

    def _bare_call(self, text: str, end: int) -> bool:
        """Decide whether a bare JSON call begins here; False when only more text can tell."""
        pos = _skip_ws(text, self.pos, end)
        may_open = self.bare == _AT_START
        if not may_open and pos < end and text[pos] == ";":
            may_open, pos = True, _skip_ws(text, pos + 1, end)
        if pos >= end:
            self.bare_pending = True
            return False
        if may_open and text[pos] == "{":
            self.region, self.start, self.pos = _CALL, pos, pos
        self.bare, self.bare_pending = None, False
        return True

    def _envelope(self, text: str, limit: int, end: int) -> bool:
        """Handle the first call envelope in the content before `limit`: True when one is open
        (`open_envelope` set) or closed (its calls taken, the content going on after it)."""
        found = self.next_envelope(text, self.start, limit, end)
        if found is None:
            return False
        start, read = found
        if read.end is None:
            self.open_envelope = start
            return True
        self.content.add(text[self.start: start])
        self.calls.extend(named_calls(read.calls))
        self._to_content(start + read.end, start + read.end)
        return True

    def _read_block(self, body: str, partial: bool) -> tuple[list[ParsedCall], int | None]:
        if self.spec.kind == "mistral":
            return parse_mistral_call(body, partial)
        call = parse_llama_call(body, partial)
        return [call], call.end if call.complete else None

    def _close_call(self, text: str, end: int) -> bool:
        """Close the open call block if its syntax closed (or proved not to be a call)."""
        try:
            calls, stop = self._read_block(text[self.pos: end], partial=True)
        except ArgumentSyntaxError:
            self._to_content(self.start, self.pos)  # not a call: its raw text is content
            return True
        if stop is None:
            return False
        self.calls.extend(ToolCall(c.name, c.arguments) for c in calls)
        after = self.pos + stop
        self._to_content(after, after)
        if self.spec.kind == "llama3_json":
            self.bare = _AFTER_CALL
        return True

    def _to_content(self, start: int, pos: int) -> None:
        self.region, self.start, self.pos = _CONTENT, start, pos
        self.scanner.reset(pos)
        self.envelopes.reset(start)

    # -- the open region --------------------------------------------------------------------------
    def _build(self, text: str, end: int, hold_back: bool) -> ChatMsg:
        msg = ChatMsg(self.reasoning.joined, self.content.joined, list(self.calls))
        segment = text[self.start: end]
        if self.region == _CONTENT and self.open_envelope is not None:
            self.build_open_envelope(msg, text, self.start, end, partial=hold_back)
        elif self.region == _CONTENT:
            if hold_back and self.bare_pending:
                segment = text[self.start: self.pos]  # a `;` that may still join another call
            elif hold_back:
                segment = cut_partial_marker(segment, self.openers + self.spec.stop_markers)
            msg.content = self.content.with_open(segment)
        elif self.region == _REASONING:
            if hold_back:
                segment = cut_partial_marker(segment, (self.spec.reasoning_end, *self.spec.stop_markers))
            msg.reasoning_content = self.reasoning.with_open(segment)
        else:
            self._build_open_call(msg, text, end, hold_back)
        return msg

    def _build_open_call(self, msg: ChatMsg, text: str, end: int, partial: bool) -> None:
        body = text[self.pos: end]
        if partial:
            body = cut_partial_marker(body, self.spec.stop_markers)
        try:
            calls, stop = self._read_block(body, partial)
            if not partial and stop is None:
                raise ArgumentSyntaxError("the output ended inside a tool call")
        except ArgumentSyntaxError:
            msg.content = join_segment(msg.content, text[self.start: end])
            return
        msg.tool_calls.extend(ToolCall(c.name, c.arguments) for c in calls if c.name is not None)
