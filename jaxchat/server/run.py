"""Run the app under uvicorn, with a graceful SIGTERM.

Contract: `serve(service, host="127.0.0.1", port=8000, api_key=None, limits=Limits(),
log_level="info", on_server=None)` blocks until the server stops and returns normally (exit status 0 for the CLI)
after SIGTERM or SIGINT. On the signal the server stops accepting connections and answers new API
requests on open connections with 503; in-flight requests get `limits.shutdown_grace_s` seconds to
finish, after which streams end with a `server_shutdown` error event and `[DONE]` (their service
iterators closed, so their slots are freed) and non-streamed requests get a 503. uvicorn's own
graceful timeout is a backstop a few seconds later. `make_server(...)` builds the same server
without running it (tests run it in a thread).
"""

from __future__ import annotations

import signal
import threading

import uvicorn

from jaxchat.api import Limits
from jaxchat.server.app import create_app

__all__ = ["make_server", "serve"]


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, drain, grace: float) -> None:
        super().__init__(config)
        self.drain = drain
        self.grace = grace

    def handle_exit(self, sig: int, frame) -> None:
        self.drain.begin(self.grace)
        super().handle_exit(sig, frame)


def make_server(
    service,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    limits: Limits | None = None,
    log_level: str = "info",
    app=None,
) -> uvicorn.Server:
    limits = limits or Limits()
    app = app if app is not None else create_app(service, api_key=api_key, limits=limits)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="off",
        access_log=log_level == "debug",
        timeout_graceful_shutdown=limits.shutdown_grace_s + 5.0,
        server_header=False,
    )
    return _Server(config, app.state.drain, limits.shutdown_grace_s)


def serve(
    service,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    limits: Limits | None = None,
    log_level: str = "info",
    on_server=None,
) -> None:
    limits = limits or Limits()
    server = make_server(service, host, port, api_key, limits, log_level)
    if on_server is not None:
        on_server(server)  # e.g. a multi-host leader that may have to cut requests and stop the server
    # uvicorn re-raises the signal it caught once it has shut down; with the default SIGTERM action
    # that would kill the process (status -15) after a clean shutdown, so SIGTERM gets a no-op
    # handler for uvicorn to restore and re-raise into.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: None) if main else None
    try:
        server.run()
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
