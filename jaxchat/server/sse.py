"""Server-sent events for streamed completions, with prompt clean-up when the client goes away.

Contract
--------
`SSEStream(chunks, ...)` is an ASGI response over a service's `ChunkStream`. It pulls the first
chunk before sending headers, so an exception there (a `RequestError` the service raises for what
only the model can check) is answered as a plain JSON error (400, or a generic 500). After that it
writes `data: {json}\n\n` per chunk, after an `event: <type>` line when the chunk has a string `type`
(Responses and Anthropic Messages events do), and `data: [DONE]\n\n` at the end unless `done=False`
(the Anthropic Messages API ends without it), with `Content-Type: text/event-stream` and
`Cache-Control: no-cache`. `error_shape(ApiError)` writes the error bodies (OpenAI's by default).
While it waits for the next chunk it also listens for `http.disconnect`: when the client leaves,
the pending `__anext__` is cancelled and the iterator is closed (`aclose()`) at once, which is how
the service learns to abort the request and free its slot, even when no chunk is due for a long
time (a request still queued). An exception after the first chunk becomes one error event
(generic text, details in the log), then the end (`[DONE]` where sent). Chunks go out as made;
the stream's `usage` (set by the service when it completes) and the time to the first chunk with
output go to the metrics.
`Drain` coordinates shutdown: after `begin(grace, message)`, in-flight work has `grace` seconds, then
streams end with a `server_shutdown` error event and non-streamed requests get a 503, both saying `message`
(by default that the server is shutting down; a lost follower process says so instead).
`run_until_gone(receive, awaitable, drain)` gives non-streamed requests the same treatment.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.types import Receive, Scope, Send

from jaxchat.api import ChunkStream
from jaxchat.server.errors import ApiError, error_for_exception

__all__ = ["ClientGone", "Drain", "SSEStream", "run_until_gone"]

log = logging.getLogger("jaxchat.server")
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_END = object()
SHUTDOWN_MESSAGE = "the server is shutting down"


class ClientGone(Exception):
    """The client disconnected before its response was complete."""


class Drain:
    """Shutdown coordination shared by every request of one app (safe to call from a signal handler)."""

    def __init__(self) -> None:
        self.draining = False
        self.cut = False
        self.message = SHUTDOWN_MESSAGE  # why: what the 503s and error events say
        self._listeners: set[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = set()
        # Re-entrant: SIGTERM's handler (`begin`) runs on the main thread between any two bytecodes, possibly
        # while that same thread holds the lock in `listen` or `unlisten`; a plain lock would deadlock there.
        self._lock = threading.RLock()

    def begin(self, grace: float, message: str = SHUTDOWN_MESSAGE) -> None:
        with self._lock:
            if self.draining:
                return
            self.draining = True
            self.message = message
        timer = threading.Timer(grace, self.cut_now)
        timer.daemon = True
        timer.start()

    def cut_now(self) -> None:
        with self._lock:
            self.cut = True
            listeners = list(self._listeners)
        for loop, fut in listeners:
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # that loop is closed
                pass

    def listen(self) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        with self._lock:
            self._listeners.add((loop, fut))
            if self.cut:
                fut.set_result(None)
        return fut

    def unlisten(self, fut: asyncio.Future) -> None:
        with self._lock:
            self._listeners.discard((fut.get_loop(), fut))
        fut.cancel()


def _resolve(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _cancel(task: asyncio.Future) -> None:
    if task.done():
        return
    task.cancel()
    try:
        await task
    except BaseException as exc:  # noqa: BLE001 - the task's own outcome no longer matters
        log.debug("a cancelled task ended with %r", exc)


async def _race(aw: Awaitable, watcher: asyncio.Future, cut: asyncio.Future) -> tuple[str, object]:
    """Run `aw` until it finishes ('done', result), the client leaves ('gone') or shutdown cuts ('cut')."""
    task = asyncio.ensure_future(aw)
    try:
        await asyncio.wait({task, watcher, cut}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            await _cancel(task)
    if task.done() and not task.cancelled():
        return "done", task.result()  # re-raises the awaitable's exception
    if watcher.done():
        return "gone", None
    if cut.done():
        return "cut", None
    raise RuntimeError("the service's awaitable was cancelled by someone else")


async def run_until_gone(receive: Receive, aw: Awaitable, drain: Drain):
    """Await `aw`, cancelling it if the client disconnects (ClientGone) or shutdown cuts it (503)."""
    watcher = asyncio.ensure_future(_wait_disconnect(receive))
    cut = drain.listen()
    try:
        kind, value = await _race(aw, watcher, cut)
    finally:
        await _cancel(watcher)
        drain.unlisten(cut)
    if kind == "gone":
        raise ClientGone()
    if kind == "cut":
        raise ApiError(503, drain.message, code="server_shutdown")
    return value


def _has_output(chunk: dict) -> bool:
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls") or choice.get("text"):
            return True
    kind = chunk.get("type")
    return kind == "content_block_delta" or (  # an Anthropic Messages event, or a Responses one
        isinstance(kind, str) and kind.startswith("response.") and kind.endswith(".delta"))


def _event(payload: object) -> bytes:
    """`data: {json}`, after an `event: <type>` line when the item names its type (Responses, Messages)."""
    data = b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"
    kind = payload.get("type") if isinstance(payload, dict) else None
    if isinstance(kind, str) and kind.isascii() and kind.isprintable():
        return b"event: " + kind.encode("ascii") + b"\n" + data
    return data


async def _next(iterator: AsyncIterator[dict]):
    try:
        return await iterator.__anext__()
    except StopAsyncIteration:
        return _END


class SSEStream:
    """ASGI response streaming a service's `ChunkStream`; `on_end(status, usage, timing)` reports to metrics."""

    def __init__(
        self,
        chunks: ChunkStream,
        drain: Drain,
        on_end: Callable[[int, dict | None, float | None, float | None, int, bool], None],
        started: float,
        done: bool = True,
        error_shape: Callable[[ApiError], dict] | None = None,
    ):
        self.iterator = chunks
        self.done = done
        self.error_shape = error_shape or ApiError.body
        self.drain = drain
        self.on_end = on_end
        self.started = started
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.outputs = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watcher = asyncio.ensure_future(_wait_disconnect(receive))
        cut = self.drain.listen()
        status, gone = 200, False
        try:
            status, gone = await self._run(send, watcher, cut)
        except OSError:  # the ASGI server refused to send: the client is gone
            gone = True
        finally:
            await _cancel(watcher)
            self.drain.unlisten(cut)
            try:
                await self.iterator.aclose()
            except Exception:
                log.exception("closing a stream's iterator failed")
            ttft = None if self.first_at is None else self.first_at - self.started
            decode = None if self.first_at is None or self.last_at is None else self.last_at - self.first_at
            usage = self.iterator.usage
            tokens = usage.get("completion_tokens", self.outputs) if isinstance(usage, dict) else self.outputs
            self.on_end(status, usage, ttft, decode, tokens if isinstance(tokens, int) else self.outputs, gone)

    async def _run(self, send: Send, watcher: asyncio.Future, cut: asyncio.Future) -> tuple[int, bool]:
        try:
            kind, item = await _race(_next(self.iterator), watcher, cut)
        except Exception as exc:  # noqa: BLE001 - validation before the first chunk: a plain JSON error
            err = error_for_exception(exc, "stream")
            await _send_json(send, err.status, self.error_shape(err))
            return err.status, False
        if kind == "gone":
            return 499, True
        if kind == "cut":
            await _send_json(send, 503, self.error_shape(_shutdown(self.drain)))
            return 503, False
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        while True:
            if item is _END:
                await self._send(send, b"data: [DONE]\n\n" if self.done else b"", more=False)
                return 200, False
            await self._emit(send, item)
            try:
                kind, item = await _race(_next(self.iterator), watcher, cut)
            except Exception as exc:  # noqa: BLE001 - a failure mid-stream: one error event
                err = error_for_exception(exc, "stream")
                await self._send(send, _event(self.error_shape(err)))
                item = _END
                continue
            if kind == "gone":
                return 200, True
            if kind == "cut":
                await self._send(send, _event(self.error_shape(_shutdown(self.drain))))
                item = _END

    async def _emit(self, send: Send, chunk: object) -> None:
        if isinstance(chunk, dict) and _has_output(chunk):
            now = time.monotonic()
            self.first_at = self.first_at or now
            self.last_at = now
            self.outputs += 1
        try:
            data = _event(chunk)
        except (TypeError, ValueError) as exc:
            data = _event(self.error_shape(error_for_exception(exc, "stream chunk")))
        await self._send(send, data)

    @staticmethod
    async def _send(send: Send, data: bytes, more: bool = True) -> None:
        await send({"type": "http.response.body", "body": data, "more_body": more})


def _shutdown(drain: Drain) -> ApiError:
    return ApiError(503, drain.message, code="server_shutdown")


async def _send_json(send: Send, status: int, body: dict) -> None:
    data = json.dumps(body).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})
