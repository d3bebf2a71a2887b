"""The Harmony (gpt-oss) parser: messages `<|start|>ROLE<|channel|>CH ...<|message|>BODY<|end|>`.

Contract: same as `chat.parse` (resumable, prefix-stable). The text starts with the prefill, the part
of the prompt after its last `<|start|>` (normally `assistant`). `analysis` messages become reasoning,
a message addressed `to=functions.NAME` becomes a tool call whose body is JSON arguments, and every
other message (`final`, `commentary` without a recipient) becomes content. `<|call|>` and `<|return|>`
end the turn.
"""

from __future__ import annotations

import re

from jaxchat.chat.args import ArgumentSyntaxError, parse_json_arguments
from jaxchat.chat.msg import ChatMsg, ChatParseOptions, ToolCall
from jaxchat.chat.parser_state import ParserState
from jaxchat.chat.segments import cut_partial_marker, join_segment
from jaxchat.chat.spec import ChatFormatSpec

START, END, CALL, RETURN, MESSAGE = "<|start|>", "<|end|>", "<|call|>", "<|return|>", "<|message|>"
_BODY_ENDS = (END, CALL, RETURN, START)
_TURN_ENDS = (CALL, RETURN)
_FUNCTIONS = "functions."
_RECIPIENT = re.compile(r"to=(\S+?)(?=\s|<\||$)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")


class _Header:
    def __init__(self, text: str) -> None:
        recipient = _RECIPIENT.search(text)
        channel = _CHANNEL.search(text)
        self.recipient = recipient.group(1) if recipient else ""
        self.channel = channel.group(1) if channel else ""

    @property
    def function(self) -> str | None:
        return self.recipient[len(_FUNCTIONS):] if self.recipient.startswith(_FUNCTIONS) else None


class HarmonyParser(ParserState):
    def __init__(self, spec: ChatFormatSpec, options: ChatParseOptions) -> None:
        super().__init__(spec, options)
        self.pos = 0  # start of the open message's header, or of its body when `header` is set
        self.header: _Header | None = None
        self.turn_end: int | None = None

    def parse(self, text: str, is_partial: bool) -> ChatMsg:
        end = self._advance(text)
        msg = ChatMsg(self.reasoning.joined, self.content.joined, list(self.calls))
        hold_back = is_partial and end == len(text)
        if self.header is not None:
            body = text[self.pos: end]
            if hold_back:
                body = cut_partial_marker(body, (*_BODY_ENDS, *self.spec.stop_markers))
            self._add_message(msg, self.header, body, partial=hold_back)
        return msg

    def _advance(self, text: str) -> int:
        if self.turn_end is not None:
            return self.turn_end
        end = len(text)
        while True:
            if self.header is None:
                idx, _ = self.scanner.find(text, (MESSAGE,), self.pos, end)
                if idx < 0:
                    return end
                self.header = _Header(text[self.pos: idx])
                self.pos = idx + len(MESSAGE)
                self.scanner.reset(self.pos)
            idx, marker = self.scanner.find(text, _BODY_ENDS + self.spec.stop_markers, self.pos, end)
            if idx < 0:
                return end
            self._close_message(self.header, text[self.pos: idx])
            self.header = None
            if marker in _TURN_ENDS or marker in self.spec.stop_markers:
                self.turn_end = self.pos = idx
                return idx
            self.pos = idx + (len(marker) if marker != START else 0)
            self.scanner.reset(self.pos)

    def _close_message(self, header: _Header, body: str) -> None:
        closed = ChatMsg()
        self._add_message(closed, header, body, partial=False)
        self.content.add(closed.content)
        self.reasoning.add(closed.reasoning_content)
        self.calls.extend(closed.tool_calls)

    def _add_message(self, msg: ChatMsg, header: _Header, body: str, partial: bool) -> None:
        name = header.function
        if name is not None and self.options.parse_tool_calls:
            try:
                arguments, complete, stop = parse_json_arguments(body, partial)
                if not partial and (not complete or body[stop:].strip()):
                    raise ArgumentSyntaxError("the tool call's arguments are not one complete JSON value")
            except ArgumentSyntaxError:
                msg.content = join_segment(msg.content, body)
                return
            msg.tool_calls.append(ToolCall(name, arguments if arguments or partial else "{}"))
        elif header.channel == "analysis":
            msg.reasoning_content = join_segment(msg.reasoning_content, body)
        else:
            msg.content = join_segment(msg.content, body)
