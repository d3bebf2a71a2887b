"""`ChunkStream`: a streamed response's chunks, with the usage of the whole response beside them.

Contract: an async iterator of JSON-able chunk dicts (`aclose()` closes the producer, which is how a
service learns that its client left and aborts its engine requests). `usage` is None until the
producer sets it, which a service does when the response is complete, whether or not the client
asked for a usage chunk (`stream_options.include_usage`): the HTTP layer reads it for its metrics
instead of digging it out of the chunks.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

__all__ = ["ChunkStream"]


class ChunkStream:
    def __init__(self, produce: Callable[[ChunkStream], AsyncGenerator[dict, None]]) -> None:
        """`produce(stream)` is the async generator of chunks; it may set `stream.usage`."""
        self.usage: dict | None = None
        self._chunks = produce(self)

    def __aiter__(self) -> ChunkStream:
        return self

    async def __anext__(self) -> dict:
        return await self._chunks.__anext__()

    async def aclose(self) -> None:
        await self._chunks.aclose()
