"""`/v1/messages` on the serving pipeline: a Messages body's `ChatRequest` in, an Anthropic message or events out.

Contract: `MessagesApi(pipeline)` serves the Anthropic Messages API on a `ChatPipeline`; it runs
the `ChatRequest` `jaxchat.api.parse_messages_request` read (same template, grammar, engine and
parser as chat completions) and writes the result with `jaxchat.api.anthropic.shapes`.
`answer(request)` returns the `message` object, from the message `complete_chat` parsed once;
`stream(request)` returns a `ChunkStream` of Messages events (`message_start`, the content
blocks' events, `message_delta`, `message_stop`; a generation that fails after the first event ends
with one `error` event), written from the `ChatRun`'s parser deltas, never by re-parsing; its `usage`
(chat-shaped, for the server's metrics) is set when the message is complete. `stop_reason` is
`stop_sequence` when one of the request's stop strings ended the output. Every 400 that needs the
model is raised before the first event, as for chat.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from jaxchat.api import shapes
from jaxchat.api.anthropic import shapes as ms
from jaxchat.api.chat_run import ChatRun
from jaxchat.api.chunk_stream import ChunkStream
from jaxchat.api.pipeline import ChatPipeline
from jaxchat.api.request import ChatRequest

__all__ = ["MessagesApi"]


class MessagesApi:
    def __init__(self, pipeline: ChatPipeline) -> None:
        self.pipeline = pipeline

    async def answer(self, request: ChatRequest) -> dict:
        prepared, results = await self.pipeline.complete_chat(request)
        msg, finish, result = results[0]
        return ms.message_json(self.pipeline.model_id, msg, finish, result.stop_reason, len(prepared.prompt_ids),
                               result.num_tokens, request.sampling.stop)

    def stream(self, request: ChatRequest) -> ChunkStream:
        return ChunkStream(lambda stream: self._events(request, stream))

    async def _events(self, request: ChatRequest, stream: ChunkStream) -> AsyncIterator[dict]:
        run = await ChatRun.start(self.pipeline, request)  # raises before the first event
        blocks = ms.ContentBlocks()
        try:
            yield ms.message_start_event(self.pipeline.model_id, run.prompt_tokens)
            async for update in run.updates():  # one choice: a Messages request has no `n`
                for delta in update.deltas:
                    for event in blocks.feed(delta):
                        yield event
                if update.failed:
                    yield ms.error_json(500, "generation failed")
                    return
                if update.finished:
                    for event in blocks.close():
                        yield event
                    stream.usage = shapes.usage(run.prompt_tokens, update.num_tokens, update.reasoning_tokens)
                    for event in ms.message_end_events(update.finish_reason, update.stop_reason, run.prompt_tokens,
                                                       update.num_tokens, request.sampling.stop):
                        yield event
        finally:
            run.cancel()
