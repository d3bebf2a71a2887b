"""The OpenAI-compatible HTTP server: Starlette routes, request validation, SSE, errors, metrics, auth.

Contract: the model pipeline is injected as a `ChatService` (see `protocol`); this package never
imports jax, flax, xgrammar, `jaxchat.models` or the engine's internals. `create_app` builds the
app, `serve` runs it under uvicorn (imported lazily so the validators load without uvicorn).
"""

from jaxchat.server.app import create_app
from jaxchat.server.limits import ServerLimits
from jaxchat.server.protocol import ChatService
from jaxchat.server.validate import validate_chat_body, validate_completion_body

__all__ = ["ChatService", "ServerLimits", "create_app", "serve", "validate_chat_body", "validate_completion_body"]


def __getattr__(name: str):
    if name == "serve":
        from jaxchat.server.run import serve

        return serve
    raise AttributeError(f"module 'jaxchat.server' has no attribute {name!r}")
