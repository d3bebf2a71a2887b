"""OpenAI error bodies and the mapping from exceptions to HTTP statuses.

Contract: every 4xx/5xx the server sends is `{"error": {"message", "type", "param", "code"}}`
(`jaxchat.api.shapes.error_body`).
`type` is `invalid_request_error` (400, 404, 405, 413), `authentication_error` (401) or
`server_error` (500, 503). `RequestError` (`jaxchat.chat`'s, re-exported by `jaxchat.api`) is a 400 carrying its `param` and its `code`
(None unless set). Any other exception is a 500 whose message is generic: the details, and
the traceback, go to the server log only, never to the client.
"""

from __future__ import annotations

import logging

from jaxchat.api import RequestError
from jaxchat.api.shapes import error_body

__all__ = ["ApiError", "error_body", "error_for_exception"]

log = logging.getLogger("jaxchat.server")

_TYPES = {401: "authentication_error", 500: "server_error", 502: "server_error", 503: "server_error"}


class ApiError(Exception):
    """An error answered with its own status and OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(status, "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_for_exception(exc: BaseException, where: str = "request") -> ApiError:
    """The ApiError a client sees for `exc`; unexpected exceptions are logged here with their traceback."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, RequestError):
        return ApiError(400, exc.message, exc.param, exc.code)
    log.error("unexpected error while handling a %s", where, exc_info=exc)
    return ApiError(500, "The server had an error while processing your request.", code="internal_error")
