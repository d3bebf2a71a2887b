"""The one seam between the HTTP server and the model pipeline.

Contract
--------
`jaxchat.server` imports `jaxchat.api` and starlette, never jax, flax, xgrammar or `jaxchat.models`
(nor the engine itself: only its public types reach it, through `jaxchat.api`). The pipeline reaches it as
an injected `ServingBackend`: a `runtime_checkable` Protocol that `create_app` checks with `isinstance`
(a TypeError otherwise). The real backend is `jaxchat.api.ChatService`; tests use a scripted fake. Every
member is required; a wire API a backend lacks is None, never found by probing.
What the server guarantees to it:

* A request arrives already read by its route's reader (`routes.WIRE_ROUTES`: `jaxchat.api.parse_chat_request`
  gives a frozen `ChatRequest`, `parse_completion_request` a `CompletionRequest`) with the server's `Limits`
  and the service's `max_context`; a `model` other than `model_id` was answered with 404 before that.
* A stream (`ChunkStream`) is always closed (`aclose()`) as soon as the client goes away, the
  server shuts down, or the stream ends, so the service frees its slots in its generator's `finally`.

What the service guarantees to the server:

* The service offers each wire API as a `WireApi` adapter: `chats` (`/v1/chat/completions`, a
  `ChatRequest`), `texts` (`/v1/completions`, a `CompletionRequest`), `responses` (`/v1/responses`, a
  `jaxchat.api.ResponsesRequest`) and `anthropic` (`/v1/messages`, a request read by
  `jaxchat.api.parse_messages_request`); `responses` / `anthropic` are None when the service does not offer
  that API (the route is then a 404). Each adapter's `answer(request)` returns the API's reply dict (OpenAI's
  `chat.completion` / `text_completion`, a Responses `response`, an Anthropic message) with its `usage`, or raises
  `jaxchat.chat.RequestError` (HTTP 400, its `param` and, if set, its `code` attribute are reported); any other
  exception is a 500 with a generic message. Its `stream(request)` returns a `ChunkStream` of the items to send
  (chunk dicts; Responses and Anthropic events, each with its `type`; a usage chunk only when the request asked
  for it), whose `usage` is set once the response is complete. Errors found before the first item are raised on
  the first `__anext__()` (they become a plain JSON 400, not an SSE stream); a failure after that yields one
  `{"error": {...}}` item and ends.
* `expect_request()`: called as a generation request comes in, before its body is read; returns None or
  an `Announcement` (an object with `close()`), which the server calls once the request has ended or has been answered without a
  stream (the engine uses the announcement to gather a burst of requests into one prefill: `Engine.expect_request`).
* `stats()` is cheap and never blocks: at least `running`, `waiting`, `slots_total`, `slots_busy`
  and `compiles` (ints); other numeric entries are exported to `/metrics` as gauges too.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from jaxchat.api import ChunkStream

__all__ = ["Announcement", "ServingBackend", "WireApi"]


class Announcement(Protocol):
    """A generation request announced to the engine (`ServingBackend.expect_request`)."""

    def close(self) -> None: ...


@runtime_checkable
class WireApi(Protocol):
    """One wire API's adapter: a request already read by its reader in, a reply dict or a stream of items out."""

    async def answer(self, request: Any) -> dict: ...

    def stream(self, request: Any) -> ChunkStream: ...


@runtime_checkable
class ServingBackend(Protocol):
    model_id: str
    max_context: int
    chats: WireApi
    texts: WireApi
    responses: WireApi | None  # None: `/v1/responses` is a 404
    anthropic: WireApi | None  # None: `/v1/messages` is a 404

    def expect_request(self) -> Announcement | None: ...

    def stats(self) -> dict: ...
