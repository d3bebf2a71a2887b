"""`/v1/responses` on the serving pipeline: a `ResponsesRequest` in, a Responses `response` or its events out.

Contract: `ResponsesApi(pipeline)` serves the OpenAI Responses API on a `ChatPipeline`; it runs the
request's `chat` (a `ChatRequest`: same template, grammar, engine and parser as chat completions) and
writes the result with `jaxchat.api.responses.shapes.ResponseWriter`. `answer(request)` returns the
`response` object (status "completed", or "incomplete" with `incomplete_details.reason`
"max_output_tokens"); `stream(request)` returns a `ChunkStream` of Responses events
(`response.created`, `response.in_progress`, the items' events, then `response.completed` /
`response.incomplete`; a generation that fails after the first event ends with `response.failed`),
written from the `ChatRun`'s parser deltas, never by re-parsing; its `usage` (chat-shaped, for the
server's metrics) is set when the response is complete. Every 400 that needs the model is raised
before the first event, as for chat.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from jaxchat.api import shapes
from jaxchat.api.chat_run import ChatRun
from jaxchat.api.chunk_stream import ChunkStream
from jaxchat.api.pipeline import ChatPipeline
from jaxchat.api.responses import shapes as rs
from jaxchat.api.responses.request import ResponsesRequest

__all__ = ["ResponsesApi"]


class ResponsesApi:
    def __init__(self, pipeline: ChatPipeline) -> None:
        self.pipeline = pipeline

    async def answer(self, request: ResponsesRequest) -> dict:
        p = self.pipeline
        prepared, results = await p.complete_chat(request.chat)
        msg, finish, result = results[0]
        writer = rs.ResponseWriter(p.model_id, request.echo, shapes.custom_tool_names(request.chat.constraint.tools))
        writer.feed(rs.message_deltas(msg))
        writer.finish(finish, rs.usage(len(prepared.prompt_ids), result.num_tokens,
                                       p.count_tokens(msg.reasoning_content), result.cached_tokens))
        return writer.response

    def stream(self, request: ResponsesRequest) -> ChunkStream:
        return ChunkStream(lambda stream: self._events(request, stream))

    async def _events(self, request: ResponsesRequest, stream: ChunkStream) -> AsyncIterator[dict]:
        run = await ChatRun.start(self.pipeline, request.chat)  # raises before the first event
        writer = rs.ResponseWriter(self.pipeline.model_id, request.echo,
                                   shapes.custom_tool_names(request.chat.constraint.tools))
        try:
            yield writer.created()
            yield writer.in_progress()
            async for update in run.updates():
                for event in writer.feed(update.deltas):
                    yield event
                if update.failed:
                    yield writer.failed()
                    return
                if update.finished:
                    stream.usage = shapes.usage(run.prompt_tokens, update.num_tokens, update.reasoning_tokens,
                                                update.cached_tokens)
                    for event in writer.finish(update.finish_reason, rs.usage(
                            run.prompt_tokens, update.num_tokens, update.reasoning_tokens, update.cached_tokens)):
                        yield event
        finally:
            run.cancel()
