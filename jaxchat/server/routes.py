"""The generation endpoints as one table: each one's path, the reader of its body, how the service answers it.

Contract: `WIRE_ROUTES` lists the wire APIs that generate (`WireRoute`): its `path`; `read(body, limits,
max_context)`, the `jaxchat.api` reader that raises every 400; `answer(service)` / `stream(service)`, the service's
methods for a plain and a streamed reply; `supported(service)`, false when the service does not implement the API
(a 404 naming `api`); `done`, whether a stream ends with `data: [DONE]`; `anthropic`, whether its errors are
Anthropic's bodies (and `x-api-key` authenticates). Adding a generation endpoint is a row here, its reader and its
adapter in `jaxchat.api`, and the service's methods (`protocol.ServingBackend`). `PATHS`: every route's path (the
metrics' labels); `ANTHROPIC_ROUTE`: the Messages API's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jaxchat.api import parse_chat_request, parse_completion_request, parse_messages_request, parse_responses_request
from jaxchat.server.protocol import ServingBackend

ANTHROPIC_ROUTE = "/v1/messages"


def _always(service: ServingBackend) -> bool:
    return True


@dataclass(frozen=True)
class WireRoute:
    path: str
    read: Callable[..., Any]
    answer: Callable[[ServingBackend], Callable]
    stream: Callable[[ServingBackend], Callable]
    api: str = ""
    supported: Callable[[ServingBackend], bool] = _always
    done: bool = True
    anthropic: bool = False


WIRE_ROUTES = (
    WireRoute("/v1/chat/completions", parse_chat_request, lambda s: s.chat_completion, lambda s: s.chat_completion_stream,
              api="Chat Completions API"),
    WireRoute("/v1/completions", parse_completion_request, lambda s: s.completion, lambda s: s.completion_stream,
              api="Completions API"),
    WireRoute("/v1/responses", parse_responses_request, lambda s: s.response, lambda s: s.response_stream,
              api="Responses API", supported=lambda s: s.supports_responses),
    WireRoute(ANTHROPIC_ROUTE, parse_messages_request, lambda s: s.messages, lambda s: s.messages_stream,
              api="Messages API", supported=lambda s: s.supports_messages, done=False, anthropic=True),
)
PATHS = (*(route.path for route in WIRE_ROUTES), "/v1/models", "/health", "/metrics")
