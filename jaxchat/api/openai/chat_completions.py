"""`/v1/chat/completions` on the serving pipeline: a `ChatRequest` in, a `chat.completion` or its chunks out.

Contract: `ChatCompletions(pipeline)` serves OpenAI chat completions on a `ChatPipeline`.
`answer(request)` returns the `chat.completion` dict (with `usage`), each choice parsed once
(`ChatPipeline.complete_chat`); under tool_choice "required" or named, `content` is null.
`stream(request)` returns a `ChunkStream` of `chat.completion.chunk` dicts written from
the `ChatRun`'s parser deltas (a role chunk per choice, the deltas, a finish chunk per choice, and a
usage chunk only with `include_usage`), whose `usage` is set when the response is complete; a custom tool's
call (`{"type": "custom", "custom": {"name", "input"}}`) streams its input in pieces as its arguments stream
(`CustomCalls`), and is written whole so in the plain reply; errors
found before the first chunk are raised on the first `__anext__()`, a failure after it is one error
chunk that ends the stream; closing it early aborts its engine requests.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from jaxchat.api import shapes
from jaxchat.api.chat_run import ChatRun
from jaxchat.api.chunk_stream import ChunkStream
from jaxchat.api.openai.custom_calls import CustomCalls
from jaxchat.api.pipeline import ChatPipeline, calls_only
from jaxchat.api.request import ChatRequest

__all__ = ["ChatCompletions"]


class ChatCompletions:
    def __init__(self, pipeline: ChatPipeline) -> None:
        self.pipeline = pipeline

    async def answer(self, request: ChatRequest) -> dict:
        p = self.pipeline
        prepared, results = await p.complete_chat(request)
        choices, completion_tokens, reasoning_tokens, cached_tokens = [], 0, 0, 0
        for index, (msg, finish, result) in enumerate(results):
            completion_tokens += result.num_tokens
            cached_tokens = max(cached_tokens, result.cached_tokens)
            reasoning_tokens += p.count_tokens(msg.reasoning_content)
            choices.append(shapes.chat_choice(index, msg, finish, shapes.logprobs_json(p.tokenizer, result.logprobs),
                                              calls_only=calls_only(prepared),
                                              custom=shapes.custom_tool_names(prepared.options.tools)))
        usage = shapes.usage(len(prepared.prompt_ids), completion_tokens, reasoning_tokens, cached_tokens)
        return shapes.chat_completion(shapes.new_id("chatcmpl"), p.model_id, choices, usage)

    def stream(self, request: ChatRequest) -> ChunkStream:
        return ChunkStream(lambda stream: self._chunks(request, stream))

    async def _chunks(self, request: ChatRequest, stream: ChunkStream) -> AsyncIterator[dict]:
        p = self.pipeline
        run = await ChatRun.start(p, request)  # raises before the first chunk
        factory = shapes.ChunkFactory(p.model_id, request.include_usage)
        custom = CustomCalls(shapes.custom_tool_names(request.constraint.tools))
        completion_tokens, reasoning_tokens, cached_tokens = 0, 0, 0
        try:
            for index in range(len(run.parsers)):
                yield factory.delta(index, {"role": "assistant", "content": None if run.calls_only else ""})
            async for update in run.updates():
                logprobs = shapes.logprobs_json(p.tokenizer, update.logprobs)
                for delta in custom.pass_through(update.index, update.deltas):
                    yield factory.delta(update.index, delta, logprobs=logprobs)
                    logprobs = None
                if update.failed:
                    yield shapes.generation_failed()
                    return
                if update.finished:
                    for delta in custom.finish(update.index):
                        yield factory.delta(update.index, delta)
                    completion_tokens += update.num_tokens
                    reasoning_tokens += update.reasoning_tokens
                    cached_tokens = max(cached_tokens, update.cached_tokens)
                    yield factory.delta(update.index, {}, update.finish_reason)
            stream.usage = shapes.usage(run.prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens)
            if request.include_usage:
                yield factory.usage_chunk(stream.usage)
        finally:
            run.cancel()
