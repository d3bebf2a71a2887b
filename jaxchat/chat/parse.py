"""The prefix-stable parser: assistant text -> reasoning_content / content / tool_calls.

Contract: `chat_parse(spec, text, is_partial, options)` reads `text` (the prefill followed by the
generated text) and returns a `ChatMsg`. For a partial text `t` and any continuation `t + u`, every
field of `chat_parse(t, True)` is a prefix of the same field of `chat_parse(t + u, ...)`: partial
markers are held back, segments are trimmed and joined with a blank line, and argument dialects
(`chat.args`) stream strings while holding scalars. The one exception is a final text cut inside a
tool call: the incomplete call is dropped and its raw text is kept in `content`.

With `ChatParseOptions.call_envelopes`, the JSON-call formats also read calls written as fenced or
bare JSON in the content (`chat.envelopes`): an envelope's opening is held back until it is decided,
a decided call streams like a native one, and an opening that proves not to be a call is content.

Formats whose calls close with their own syntax (`llama3_json`, `mistral`) are read by
`chat.parse_inline`, Harmony by `chat.parse_harmony`. The parsers are resumable:
`make_parser(spec, options)` returns an object whose `parse(text, partial)`
may be called again with a longer text that extends the previous one; regions that closed are not
scanned again, so a stream costs linear time overall (see `chat.stream`).
"""

from __future__ import annotations

from jaxchat.chat.args import (
    ArgumentSyntaxError,
    ParsedCall,
    parse_gemma4_call,
    parse_hermes_call,
    parse_python_calls,
    parse_qwen_xml_call,
)
from jaxchat.chat.args_json_calls import parse_deepseek_calls
from jaxchat.chat.msg import ChatMsg, ChatParseOptions
from jaxchat.chat.parse_harmony import HarmonyParser
from jaxchat.chat.parse_inline import InlineCallParser
from jaxchat.chat.parser_state import CONTENT, MarkerParser, named_calls
from jaxchat.chat.segments import cut_partial_marker, join_segment
from jaxchat.chat.spec import ChatFormatSpec

_CONTENT, _REASONING, _TOOL = CONTENT, "reasoning", "tool"
_GEMMA_THOUGHT = "thought"


def tool_body_calls(
    spec: ChatFormatSpec, body: str, partial: bool, options: ChatParseOptions
) -> list[ParsedCall]:
    """The calls in one tool block's body; raises ArgumentSyntaxError when it cannot be (a prefix of) valid syntax."""
    if spec.kind == "hermes_json":
        calls = [parse_hermes_call(body, partial)]
    elif spec.kind == "qwen_xml":
        calls = [parse_qwen_xml_call(body, partial, options.tool_schema(_qwen_xml_name(body)))]
    elif spec.kind == "lfm2":
        return parse_python_calls(body, partial)  # validates the whole call list itself
    elif spec.kind == "deepseek_v3":
        return parse_deepseek_calls(body, partial)  # validates the whole block itself
    elif spec.kind == "gemma4":
        calls = [parse_gemma4_call(body, partial)]
    else:
        raise ArgumentSyntaxError(f"format {spec.kind} has no tool-call syntax")
    last = calls[-1] if calls else None
    if last is not None and last.complete and body[last.end:].strip():
        raise ArgumentSyntaxError(f"unexpected text after the tool call at offset {last.end}")
    return calls


def _qwen_xml_name(body: str) -> str:
    start = body.find("<function=")
    if start < 0:
        return ""
    stop = body.find(">", start)
    return body[start + len("<function="): stop if stop >= 0 else len(body)].strip()


class TaggedParser(MarkerParser):
    """Parser of the tag formats: content, `<think>`-style reasoning blocks and tool blocks."""

    def parse(self, text: str, is_partial: bool) -> ChatMsg:
        end = self.stops.end(text)
        self._advance(text, end)
        return self._build(text, end, is_partial and end == len(text))

    def _advance(self, text: str, end: int) -> None:
        spec = self.spec
        self.open_envelope = None
        while True:
            if self.region == _CONTENT:
                idx, marker = self.scanner.find(text, self.openers, self.pos, end)
                if self._envelope(text, idx if idx >= 0 else end, end):
                    if self.open_envelope is not None:
                        return
                    continue
                if idx < 0:
                    return
                self.content.add(text[self.pos: idx])
                self.region = _REASONING if marker == spec.reasoning_start else _TOOL
            elif self.region == _REASONING:
                idx, marker = self.scanner.find(text, (spec.reasoning_end,), self.pos, end)
                if idx < 0:
                    return
                self.reasoning.add(self._reasoning_text(text[self.pos: idx], partial=False))
                self.region = _CONTENT
            else:
                idx, marker = self.scanner.find(text, (spec.tool_end,), self.pos, end)
                if idx < 0:
                    return
                self._close_tool(text[self.pos: idx])
                self.region = _CONTENT
            self.pos = idx + len(marker)
            self.scanner.reset(self.pos)

    def _envelope(self, text: str, limit: int, end: int) -> bool:
        """Handle the first call envelope in the content before `limit`: True when one is open
        (`open_envelope` set) or closed (its calls taken, the content going on after it)."""
        found = self.next_envelope(text, self.pos, limit, end)
        if found is None:
            return False
        start, read = found
        if read.end is None:
            self.open_envelope = start
            return True
        self.content.add(text[self.pos: start])
        self.calls.extend(named_calls(read.calls))
        self.pos = start + read.end
        self.scanner.reset(self.pos)
        self.envelopes.reset(self.pos)
        return True

    def _close_tool(self, body: str) -> None:
        try:
            calls = tool_body_calls(self.spec, body, False, self.options)
            if not all(c.complete and c.name is not None for c in calls):
                raise ArgumentSyntaxError("incomplete tool call")
        except ArgumentSyntaxError:
            self.content.add(self.spec.tool_start + body + self.spec.tool_end)
            return
        self.calls.extend(named_calls(calls))

    def _reasoning_text(self, segment: str, partial: bool) -> str:
        if self.spec.kind != "gemma4":
            return segment
        stripped = segment.lstrip()
        if stripped.startswith(_GEMMA_THOUGHT):
            return stripped[len(_GEMMA_THOUGHT):]
        return "" if partial and _GEMMA_THOUGHT.startswith(stripped) else segment

    def _build(self, text: str, end: int, hold_back: bool) -> ChatMsg:
        spec = self.spec
        segment = text[self.pos: end]
        msg = ChatMsg(self.reasoning.joined, self.content.joined, list(self.calls))
        if self.region == _CONTENT and self.open_envelope is not None:
            self.build_open_envelope(msg, text, self.pos, end, partial=hold_back)
        elif self.region == _CONTENT:
            if hold_back:
                segment = cut_partial_marker(segment, self.openers + spec.stop_markers)
            msg.content = self.content.with_open(segment)
        elif self.region == _REASONING:
            if hold_back:
                segment = cut_partial_marker(segment, (spec.reasoning_end, *spec.stop_markers))
            msg.reasoning_content = self.reasoning.with_open(self._reasoning_text(segment, hold_back))
        else:
            if hold_back:
                segment = cut_partial_marker(segment, (spec.tool_end, *spec.stop_markers))
            self._build_open_tool(msg, segment, partial=hold_back)
        return msg

    def _build_open_tool(self, msg: ChatMsg, body: str, partial: bool) -> None:
        try:
            calls = tool_body_calls(self.spec, body, partial, self.options)
            if not partial and not all(c.complete and c.name is not None for c in calls):
                raise ArgumentSyntaxError("the output ended inside a tool call")
        except ArgumentSyntaxError:
            msg.content = join_segment(msg.content, self.spec.tool_start + body)
            return
        msg.tool_calls.extend(named_calls(calls))


def make_parser(spec: ChatFormatSpec, options: ChatParseOptions = ChatParseOptions()):
    """A resumable parser for `spec`: call `.parse(text, is_partial)` with ever longer texts."""
    if spec.kind == "harmony":
        return HarmonyParser(spec, options)
    if spec.kind in ("llama3_json", "mistral"):
        return InlineCallParser(spec, options)
    return TaggedParser(spec, options)


def chat_parse(
    spec: ChatFormatSpec, text: str, is_partial: bool, options: ChatParseOptions = ChatParseOptions()
) -> ChatMsg:
    return make_parser(spec, options).parse(text, is_partial)
