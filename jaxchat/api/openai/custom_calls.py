"""Streamed custom tool calls: a custom tool's input is streamed as its call's arguments are.

Contract: `CustomCalls(names)` sits between a choice's parser deltas and the chunks of a streamed chat completion.
`pass_through(index, deltas)` returns the chunk delta dicts to send now, in order: those of function calls,
content and reasoning as `shapes.delta_json` writes them; a call whose tool is a custom one (`names`) as
`{"tool_calls": [{"index", "id", "type": "custom", "custom": {"name", "input"}}]}` when it opens, then
`{"tool_calls": [{"index", "custom": {"input"}}]}` for each piece of input its arguments add (`CustomInput`: the
JSON string decoded as it streams). `finish(index)` returns the deltas of choice `index` that complete its custom
calls' inputs (none when everything was sent), once. The input pieces of a call concatenate to the non-streamed
input (`custom_input` of the whole arguments).
"""

from __future__ import annotations

from jaxchat.api.custom_input import CustomInput
from jaxchat.api.shapes import delta_json

__all__ = ["CustomCalls"]


def _piece(at: int, text: str) -> dict:
    return {"tool_calls": [{"index": at, "custom": {"input": text}}]}


class CustomCalls:
    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self._calls: dict[int, dict[int, CustomInput]] = {}  # choice -> tool call index -> its input so far

    def pass_through(self, index: int, deltas) -> list[dict]:
        calls = self._calls.setdefault(index, {})
        out = []
        for delta in deltas:
            at = delta.tool_call_index
            if at is not None and delta.tool_call_id is not None and delta.tool_call_name in self.names:
                calls[at] = reader = CustomInput()
                out.append({"tool_calls": [{"index": at, "id": delta.tool_call_id, "type": "custom", "custom": {
                    "name": delta.tool_call_name, "input": reader.feed(delta.tool_call_arguments or "")}}]})
            elif at is not None and at in calls:
                text = calls[at].feed(delta.tool_call_arguments or "")
                if text:
                    out.append(_piece(at, text))
            else:
                out.append(delta_json(delta))
        return out

    def finish(self, index: int) -> list[dict]:
        calls = self._calls.pop(index, {})
        return [_piece(at, rest) for at, reader in sorted(calls.items()) if (rest := reader.finish())]
