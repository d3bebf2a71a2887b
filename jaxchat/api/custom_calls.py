"""Streamed custom tool calls: a custom tool's call is sent as one delta once its choice ends.

Contract: `CustomCalls(names)` sits between a choice's parser deltas and the chunks of a streamed chat completion.
`pass_through(index, deltas)` returns the deltas to send now: those of function calls, content and reasoning
unchanged; the deltas of a call whose tool is a custom one (`names`) are kept back and gathered. `finish(index)`
returns the kept calls of choice `index` as `tool_calls` delta dicts
(`{"index", "id", "type": "custom", "custom": {"name", "input"}}`), in call order, once: the input is read
from the whole arguments (`shapes.custom_input`), so the streamed input equals the non-streamed one.
"""

from __future__ import annotations

from jaxchat.api.shapes import custom_input

__all__ = ["CustomCalls"]


class CustomCalls:
    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self._calls: dict[int, dict[int, list[str]]] = {}  # choice -> tool call index -> [id, name, arguments]

    def pass_through(self, index: int, deltas: list) -> list:
        if not self.names:
            return deltas
        calls = self._calls.setdefault(index, {})
        out = []
        for delta in deltas:
            at = delta.tool_call_index
            if at is not None and delta.tool_call_id is not None and delta.tool_call_name in self.names:
                calls[at] = [delta.tool_call_id, delta.tool_call_name, delta.tool_call_arguments or ""]
            elif at is not None and at in calls:
                calls[at][2] += delta.tool_call_arguments or ""
            else:
                out.append(delta)
        return out

    def finish(self, index: int) -> list[dict]:
        calls = self._calls.pop(index, {})
        return [{"index": at, "id": cid, "type": "custom", "custom": {"name": name, "input": custom_input(args)}}
                for at, (cid, name, args) in sorted(calls.items())]
