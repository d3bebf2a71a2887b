"""OpenAI Responses shapes: the `response` object, its output items, usage and the streaming events.

Contract: pure builders, no I/O. `ResponseWriter(model, echo)` turns the chat pipeline's
`ChatMsgDelta`s into Responses output items and, as it goes, the documented stream events, each with
its `type` and a `sequence_number` counted from 0: `created()` / `in_progress()` (the response with
status "in_progress" and no output), `feed(deltas)` (items open in the order their first delta
arrives: a `reasoning` item with one `summary_text` part, a `message` with one `output_text` part, a
`function_call` per call with its `call_id`, `name` and `arguments`, or, for a tool named in `custom`, a
`custom_tool_call` with its `call_id`, `name` and `input`, whose input streams as its arguments do
(`response.custom_tool_call_input.delta` per piece, `jaxchat.api.custom_input.CustomInput`, then `.done` with the
whole input, `custom_input` of the whole arguments); `response.output_item.added`,
`response.content_part.added` / `response.reasoning_summary_part.added`, then the `.delta` events),
`finish(finish_reason, usage)` (every open item's `.done` events and `response.output_item.done`,
in output order, then `response.completed`, or `response.incomplete` with `incomplete_details.reason`
"max_output_tokens" when the engine stopped at the token limit) and `failed()` (`response.failed`).
`response` is the final response object; a non-streamed reply is built by feeding the parsed
message's deltas from an empty message (`message_deltas`) to the same writer, so both modes agree by
construction (when a model writes text after a call, a stream lists the message after that call).
`usage(input, output, reasoning, cached)` is the Responses usage object.
"""

from __future__ import annotations

import time
import uuid

from jaxchat.api.custom_input import CustomInput
from jaxchat.chat import ChatMsg, ChatMsgDelta, chat_compute_deltas

__all__ = ["ResponseWriter", "message_deltas", "new_id", "usage"]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(input_tokens: int, output_tokens: int, reasoning_tokens: int = 0, cached_tokens: int = 0) -> dict:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }


def message_deltas(msg: ChatMsg) -> list[ChatMsgDelta]:
    """The deltas that build `msg` from nothing (reasoning, content, then each call whole)."""
    return chat_compute_deltas(ChatMsg(), msg)


class ResponseWriter:
    def __init__(self, model: str, echo: dict, custom: frozenset[str] = frozenset()) -> None:
        self.custom = custom
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self.model = model
        self.echo = echo
        self.items: list[dict] = []  # the output items, as built so far
        self._reasoning: int | None = None  # output indexes of the open items
        self._message: int | None = None
        self._calls: dict[int, int] = {}  # chat tool call index -> output index
        self._inputs: dict[int, CustomInput] = {}  # output index of a custom tool call -> its input so far
        self._seq = 0
        self.status = "in_progress"
        self.incomplete_reason: str | None = None
        self.usage: dict | None = None
        self.error: dict | None = None

    def _event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return event

    @property
    def response(self) -> dict:
        return {
            "id": self.id, "object": "response", "created_at": self.created_at, "status": self.status,
            "model": self.model, "output": [dict(item) for item in self.items], "error": self.error,
            "incomplete_details": {"reason": self.incomplete_reason} if self.incomplete_reason else None,
            "usage": self.usage, **self.echo,
        }

    def _lifecycle(self, kind: str) -> dict:
        response = self.response
        if self.status == "in_progress":
            response["output"] = []
        return self._event(kind, response=response)

    def created(self) -> dict:
        return self._lifecycle("response.created")

    def in_progress(self) -> dict:
        return self._lifecycle("response.in_progress")

    # ---- items --------------------------------------------------------------------------------------
    def _open(self, item: dict) -> tuple[int, dict]:
        self.items.append(item)
        index = len(self.items) - 1
        return index, self._event("response.output_item.added", output_index=index, item=dict(item))

    def feed(self, deltas) -> list[dict]:
        events: list[dict] = []
        for delta in deltas:
            if delta.reasoning_content:
                events += self._reasoning_delta(delta.reasoning_content)
            if delta.content:
                events += self._text_delta(delta.content)
            if delta.tool_call_index is not None:
                events += self._call_delta(delta)
        return events

    def _reasoning_delta(self, text: str) -> list[dict]:
        events = []
        if self._reasoning is None:
            item = {"id": new_id("rs"), "type": "reasoning", "summary": [], "status": "in_progress", "_text": ""}
            self._reasoning, added = self._open(item)
            added["item"].pop("_text")
            events += [added, self._event("response.reasoning_summary_part.added", item_id=item["id"],
                                          output_index=self._reasoning, summary_index=0,
                                          part={"type": "summary_text", "text": ""})]
        item = self.items[self._reasoning]
        item["_text"] += text
        return [*events, self._event("response.reasoning_summary_text.delta", item_id=item["id"],
                                     output_index=self._reasoning, summary_index=0, delta=text)]

    def _text_delta(self, text: str) -> list[dict]:
        events = []
        if self._message is None:
            item = {"id": new_id("msg"), "type": "message", "role": "assistant", "status": "in_progress",
                    "content": []}
            self._message, added = self._open(item)
            item["content"] = [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]
            events += [added, self._event("response.content_part.added", item_id=item["id"],
                                          output_index=self._message, content_index=0,
                                          part=dict(item["content"][0]))]
        item = self.items[self._message]
        item["content"][0]["text"] += text
        return [*events, self._event("response.output_text.delta", item_id=item["id"], output_index=self._message,
                                     content_index=0, delta=text, logprobs=[])]

    def _call_delta(self, delta: ChatMsgDelta) -> list[dict]:
        events = []
        if delta.tool_call_index not in self._calls:
            if delta.tool_call_name in self.custom:
                item = {"id": new_id("ctc"), "type": "custom_tool_call", "call_id": delta.tool_call_id,
                        "name": delta.tool_call_name, "input": "", "status": "in_progress"}
            else:
                item = {"id": new_id("fc"), "type": "function_call", "call_id": delta.tool_call_id,
                        "name": delta.tool_call_name, "arguments": "", "status": "in_progress"}
            self._calls[delta.tool_call_index], added = self._open(item)
            if item["type"] == "custom_tool_call":
                self._inputs[self._calls[delta.tool_call_index]] = CustomInput()
            events.append(added)
        index = self._calls[delta.tool_call_index]
        item = self.items[index]
        if item["type"] == "custom_tool_call":
            text = self._inputs[index].feed(delta.tool_call_arguments or "")
            if text:
                item["input"] += text
                events.append(self._event("response.custom_tool_call_input.delta", item_id=item["id"],
                                          output_index=index, delta=text))
        elif delta.tool_call_arguments:
            item["arguments"] += delta.tool_call_arguments
            events.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=index, delta=delta.tool_call_arguments))
        return events

    # ---- the end ------------------------------------------------------------------------------------
    def finish(self, finish_reason: str | None, usage_json: dict) -> list[dict]:
        cut = finish_reason == "length"
        self.status, self.incomplete_reason = ("incomplete", "max_output_tokens") if cut else ("completed", None)
        self.usage = usage_json
        item_status = "incomplete" if cut else "completed"
        events = []
        for index, item in enumerate(self.items):
            item["status"] = item_status
            events += self._done(index, item)
        return [*events, self._lifecycle("response.incomplete" if cut else "response.completed")]

    def _done(self, index: int, item: dict) -> list[dict]:
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "reasoning":
            text = item.pop("_text")
            part = {"type": "summary_text", "text": text}
            item["summary"] = [part]
            events = [self._event("response.reasoning_summary_text.done", **where, summary_index=0, text=text),
                      self._event("response.reasoning_summary_part.done", **where, summary_index=0, part=dict(part))]
        elif item["type"] == "message":
            part = item["content"][0]
            events = [self._event("response.output_text.done", **where, content_index=0, text=part["text"],
                                  logprobs=[]),
                      self._event("response.content_part.done", **where, content_index=0, part=dict(part))]
        elif item["type"] == "custom_tool_call":
            rest = self._inputs.pop(index).finish()
            item["input"] += rest
            events = [self._event("response.custom_tool_call_input.delta", **where, delta=rest)] if rest else []
            events.append(self._event("response.custom_tool_call_input.done", **where, input=item["input"]))
        else:
            events = [self._event("response.function_call_arguments.done", **where, name=item["name"],
                                  arguments=item["arguments"])]
        return [*events, self._event("response.output_item.done", output_index=index, item=dict(item))]

    def failed(self) -> dict:
        self.status = "failed"
        self.error = {"code": "server_error", "message": "generation failed"}
        for item in self.items:
            item.pop("_text", None)
            item["status"] = "incomplete"
        return self._lifecycle("response.failed")
