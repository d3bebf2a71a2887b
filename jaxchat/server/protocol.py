"""The one seam between the HTTP server and the model pipeline.

Contract
--------
`jaxchat.server` imports `jaxchat.api` and starlette, never jax, flax, xgrammar or `jaxchat.models`
(nor the engine itself: only its public types reach it, through `jaxchat.api`). The pipeline reaches it as
an injected `ServingBackend`: a `runtime_checkable` Protocol that `create_app` checks with `isinstance`
(a TypeError otherwise). The real backend is `jaxchat.api.ChatService`; tests use a scripted fake. Every
member is required; what a backend may lack is said by its capability flags, never found by probing.
What the server guarantees to it:

* A request arrives already read by `jaxchat.api.parse_chat_request` / `parse_completion_request`
  (a frozen `ChatRequest` / `CompletionRequest`) with the server's `Limits` and the service's
  `max_context`; a `model` other than `model_id` was answered with 404 before that.
* A stream (`ChunkStream`) is always closed (`aclose()`) as soon as the client goes away, the
  server shuts down, or the stream ends, so the service frees its slots in its generator's `finally`.

What the service guarantees to the server:

* `chat_completion` / `completion` return an OpenAI `chat.completion` / `text_completion` dict with
  a `usage` object, or raise `jaxchat.chat.RequestError` (HTTP 400, its `param` and, if set, its
  `code` attribute are reported); any other exception is a 500 with a generic message.
* `chat_completion_stream` / `completion_stream` return a `ChunkStream` of chunk dicts, exactly the
  ones to send (a usage chunk only when the request asked for it), whose `usage` is set once the
  response is complete. Errors found before the first chunk are raised on the first `__anext__()`
  (they become a plain JSON 400, not an SSE stream); a failure after that yields one
  `{"error": {...}}` item and ends.
* `response` / `response_stream` (served only when `supports_responses` is true, else `/v1/responses` is a
  404) take a
  `jaxchat.api.ResponsesRequest` and return a Responses `response` dict / a `ChunkStream` of
  Responses events (each a dict with its `type`), under the same rules as the chat methods.
* `messages` / `messages_stream` (served only when `supports_messages` is true, else `/v1/messages` is a
  404): a request read by
  `jaxchat.api.parse_messages_request`, answered with an Anthropic message dict / a `ChunkStream` of
  Anthropic events (each `type` is its SSE event name), under the same rules.
* `expect_request()`: called as a generation request comes in, before its body is read; returns None or
  an `Announcement` (an object with `close()`), which the server calls once the request has ended or has been answered without a
  stream (the engine uses the announcement to gather a burst of requests into one prefill: `Engine.expect_request`).
* `stats()` is cheap and never blocks: at least `running`, `waiting`, `slots_total`, `slots_busy`
  and `compiles` (ints); other numeric entries are exported to `/metrics` as gauges too.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from jaxchat.api import ChatRequest, ChunkStream, CompletionRequest, ResponsesRequest

__all__ = ["Announcement", "ServingBackend"]


class Announcement(Protocol):
    """A generation request announced to the engine (`ServingBackend.expect_request`)."""

    def close(self) -> None: ...


@runtime_checkable
class ServingBackend(Protocol):
    model_id: str
    max_context: int
    supports_responses: bool  # `response` / `response_stream` serve `/v1/responses`
    supports_messages: bool  # `messages` / `messages_stream` serve `/v1/messages`

    def expect_request(self) -> Announcement | None: ...

    async def chat_completion(self, request: ChatRequest) -> dict: ...

    def chat_completion_stream(self, request: ChatRequest) -> ChunkStream: ...

    async def completion(self, request: CompletionRequest) -> dict: ...

    def completion_stream(self, request: CompletionRequest) -> ChunkStream: ...

    async def response(self, request: ResponsesRequest) -> dict: ...

    def response_stream(self, request: ResponsesRequest) -> ChunkStream: ...

    async def messages(self, request: ChatRequest) -> dict: ...

    def messages_stream(self, request: ChatRequest) -> ChunkStream: ...

    def stats(self) -> dict: ...
