"""Read a request body as one JSON object, refusing anything else with a clear 4xx.

Contract: `read_json_object(request, limits)` returns the decoded JSON value or raises `ApiError`:
413 when the body is larger than `limits.max_body_bytes` (checked on Content-Length first, then
while reading, so a chunked body cannot get past it); 400 for a Content-Type that is not JSON
(a missing one is read as JSON, as curl users expect), an empty body, invalid UTF-8, malformed or
truncated JSON, `NaN`/`Infinity`, numbers out of range, or nesting deeper than `limits.max_json_depth`.
That the value is an object is the request reader's check (`jaxchat.api.request`).
"""

from __future__ import annotations

import json

from starlette.requests import ClientDisconnect, Request

from jaxchat.api import Limits
from jaxchat.server.errors import ApiError

__all__ = ["json_depth", "read_json_object"]


def _content_type_is_json(value: str | None) -> bool:
    if not value:
        return True
    media = value.split(";", 1)[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        return False
    for param in value.split(";")[1:]:
        key, _, val = param.partition("=")
        if key.strip().lower() == "charset" and val.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return False
    return True


async def _read_bounded(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise ApiError(400, "invalid Content-Length header") from None
        if size > limit:
            raise ApiError(413, f"request body is {size} bytes; the limit is {limit} bytes", code="request_too_large")
    chunks, total = [], 0
    try:
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise ApiError(413, f"request body is larger than the limit of {limit} bytes", code="request_too_large")
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(400, "the client disconnected before sending the whole body") from None
    return b"".join(chunks)


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not valid JSON")


def json_depth(value: object) -> int:
    """The number of nested containers (objects and arrays) in a decoded JSON value, without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item)
    return deepest


async def read_json_object(request: Request, limits: Limits) -> object:
    content_type = request.headers.get("content-type")
    if not _content_type_is_json(content_type):
        raise ApiError(
            400, f"Content-Type must be application/json, got {content_type[:80]!r}", code="invalid_content_type"
        )
    raw = await _read_bounded(request, limits.max_body_bytes)
    if not raw.strip():
        raise ApiError(400, "the request body is empty; send a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not valid UTF-8 (byte {exc.start})") from None
    try:
        body = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ApiError(
            400, f"the request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise ApiError(
            400, f"the request body is nested too deeply (the limit is {limits.max_json_depth} levels)"
        ) from None
    except ValueError as exc:  # NaN/Infinity, integers with too many digits
        raise ApiError(400, f"the request body is not valid JSON: {str(exc)[:120]}") from None
    if json_depth(body) > limits.max_json_depth:
        raise ApiError(400, f"the request body is nested too deeply (the limit is {limits.max_json_depth} levels)")
    return body
