"""The generation endpoints as one table: each one's path, the reader of its body, the service's adapter for it.

Contract: `WIRE_ROUTES` lists the wire APIs that generate (`WireRoute`): its `path`; `read(body, limits,
max_context)`, the `jaxchat.api` reader that raises every 400; `adapter_of(service)`, the service's `WireApi`
that answers it (`protocol.ServingBackend`: None there is a 404 naming `api`); `done`, whether a stream
ends with `data: [DONE]`; `anthropic`, whether its errors are Anthropic's bodies (and `x-api-key` authenticates).
Adding a generation endpoint is a row here, its reader and its adapter in `jaxchat.api`, and one attribute of the
service. `PATHS`: every route's path (the metrics' labels); `ANTHROPIC_ROUTE`: the Messages API's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jaxchat.api import parse_chat_request, parse_completion_request, parse_messages_request, parse_responses_request
from jaxchat.server.protocol import ServingBackend, WireApi

ANTHROPIC_ROUTE = "/v1/messages"


@dataclass(frozen=True)
class WireRoute:
    path: str
    read: Callable[..., Any]
    adapter_of: Callable[[ServingBackend], WireApi | None]
    api: str
    done: bool = True
    anthropic: bool = False


WIRE_ROUTES = (
    WireRoute("/v1/chat/completions", parse_chat_request, lambda s: s.chats, "Chat Completions API"),
    WireRoute("/v1/completions", parse_completion_request, lambda s: s.texts, "Completions API"),
    WireRoute("/v1/responses", parse_responses_request, lambda s: s.responses, "Responses API"),
    WireRoute(ANTHROPIC_ROUTE, parse_messages_request, lambda s: s.anthropic, "Messages API", done=False,
              anthropic=True),
)
PATHS = (*(route.path for route in WIRE_ROUTES), "/v1/models", "/health", "/metrics")
