"""Outputs cut before the model ended its turn, and how a chat reply reads them.

Contract: `was_cut(finish, stop_reason, request_stop_ids, turn_stop_ids)` is True when the engine
ended an output by `max_tokens` ("length"), by a stop string (`stop_reason` a str) or by one of the
request's own stop tokens that is not one of the model's turn ends. The service parses a cut output
as a partial text (what the stream delivered: a call it cut keeps its name and the arguments so far,
a piece of a marker at the end is held back, no call markup becomes content) whenever the reply's
tool calls are parsed; `cut_finish_reason(msg, finish, cut)` is then the engine's reason as it is
("length" or "stop": a cut call is never reported as finished "tool_calls").
"""

from __future__ import annotations

from collections.abc import Collection

from jaxchat.chat import ChatMsg, chat_finish_reason

__all__ = ["cut_finish_reason", "was_cut"]


def was_cut(finish: str | None, stop_reason: str | int | None, request_stop_ids: Collection[int],
            turn_stop_ids: Collection[int]) -> bool:
    if finish == "length" or (finish == "stop" and isinstance(stop_reason, str)):
        return True
    return finish == "stop" and stop_reason in request_stop_ids and stop_reason not in turn_stop_ids


def cut_finish_reason(msg: ChatMsg, finish: str | None, cut: bool) -> str | None:
    return finish if cut else chat_finish_reason(msg, finish)
