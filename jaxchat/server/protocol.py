"""The one seam between the HTTP server and the model pipeline.

Contract
--------
`jaxchat.server` never imports jax, flax, xgrammar, `jaxchat.models` or the engine's internals. The
pipeline reaches it as an injected object implementing `ChatService` (the engine's implementation is
`jaxchat.engine.service.ChatService`; tests use a scripted fake). What the server guarantees to it:

* `body` is the request already checked and normalised by `jaxchat.server.validate` (a fresh dict the
  service may keep): null fields are removed; `stop` is a list of strings; `max_tokens` and
  `max_completion_tokens` both hold the effective limit when either was given; `model` is the
  service's `model_id`. Streaming bodies always carry `stream: true` and
  `stream_options.include_usage: true` (the server needs the usage for its token metrics and drops
  the usage chunk, and the `usage` keys, when the client did not ask for them).
* A stream's async iterator is always closed (`aclose()`) as soon as the client goes away, the server
  shuts down, or the stream ends, so the service frees its slots in its generator's `finally`.

What the service guarantees to the server:

* `chat_completion` / `completion` return an OpenAI `chat.completion` / `text_completion` dict with
  a `usage` object, or raise `jaxchat.chat.RequestError` (HTTP 400, its `param` and, if set, its
  `code` attribute are reported); any other exception is a 500 with a generic message.
* `chat_completion_stream` / `completion_stream` return async iterators of chunk dicts. Validation
  errors are raised on the first `__anext__()`, before any chunk is yielded (they become a plain
  JSON 400, not an SSE stream). A failure after that yields one `{"error": {...}}` item and ends.
* `stats()` is cheap and never blocks: at least `running`, `waiting`, `slots_total`, `slots_busy`
  and `compiles` (ints); other numeric entries are exported to `/metrics` as gauges too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

__all__ = ["ChatService"]


@runtime_checkable
class ChatService(Protocol):
    model_id: str
    max_context: int

    async def chat_completion(self, body: dict) -> dict: ...

    def chat_completion_stream(self, body: dict) -> AsyncIterator[dict]: ...

    async def completion(self, body: dict) -> dict: ...

    def completion_stream(self, body: dict) -> AsyncIterator[dict]: ...

    def stats(self) -> dict: ...
