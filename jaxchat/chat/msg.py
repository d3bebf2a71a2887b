"""Parsed assistant messages and the deltas between two parses.

Contract: `ChatMsg` is what `chat_parse` returns; `ChatMsgDelta` is one streamed piece
(a reasoning suffix, a content suffix, or one tool call's first appearance / argument suffix).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text; during streaming a prefix of the final JSON text
    id: str = ""


@dataclass
class ChatMsg:
    reasoning_content: str = ""
    content: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


@dataclass(frozen=True)
class ChatParseOptions:
    parse_tool_calls: bool = True
    tools: Sequence[dict] = ()
    # Also read calls of `tools` written in the spec's call envelopes (fenced or bare JSON in the
    # content, `chat.envelopes`); the service turns it on where the grammar constrains them.
    call_envelopes: bool = False

    def tool_names(self) -> frozenset[str]:
        """The names of the declared tools."""
        names = set()
        for tool in self.tools:
            function = tool.get("function", tool) if isinstance(tool, dict) else None
            if isinstance(function, dict) and isinstance(function.get("name"), str):
                names.add(function["name"])
        return frozenset(names)

    def tool_schema(self, name: str) -> dict | None:
        """The JSON schema of the parameters of tool `name`, or None when it is not declared."""
        for tool in self.tools:
            function = tool.get("function", tool) if isinstance(tool, dict) else None
            if isinstance(function, dict) and function.get("name") == name:
                params = function.get("parameters")
                return params if isinstance(params, dict) else None
        return None


@dataclass(frozen=True)
class ChatMsgDelta:
    reasoning_content: str = ""
    content: str = ""
    tool_call_index: int | None = None
    tool_call_id: str | None = None  # set on the first delta of a call only
    tool_call_name: str | None = None  # set on the first delta of a call only
    tool_call_arguments: str = ""
