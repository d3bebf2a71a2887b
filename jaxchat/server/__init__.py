"""The OpenAI-compatible HTTP server: Starlette routes, auth, body limits, SSE framing, errors, metrics.

Contract: HTTP only. A body is read by `jaxchat.api` (the typed request, every 400) and handed to an
injected `ServingBackend` (see `protocol`); this package imports only `jaxchat.api` and starlette, never
jax, flax, xgrammar or `jaxchat.models` (the engine's public types, which `jaxchat.api` uses, load
with numpy alone). `create_app` builds the app, `serve` runs it under uvicorn (imported
lazily so the app loads without uvicorn).
"""

from jaxchat.server.app import create_app
from jaxchat.server.protocol import ServingBackend, WireApi

__all__ = ["ServingBackend", "WireApi", "create_app", "serve"]


def __getattr__(name: str):
    if name == "serve":
        from jaxchat.server.run import serve

        return serve
    raise AttributeError(f"module 'jaxchat.server' has no attribute {name!r}")
