"""`/v1/completions` on the serving pipeline: a prompt (text or token ids) in, the engine's text out.

Contract: `TextCompletions(pipeline)` serves `CompletionRequest`s on a `ChatPipeline` (its tokenizer,
prompt checks, sampling and engine). `answer(request)` returns a
`text_completion` with `n` choices; `stream(request)` a `ChunkStream` of `text_completion`
chunks (each carries one choice's `index`; `n` choices interleave as the engine produces them), its
`usage` set at the end and sent as a last chunk only with `include_usage`; `echo` puts the prompt's
text before each choice's text. A failure after the first chunk is one error chunk that ends the
stream. `generate(request)` runs one choice to its end (the notebook API's `generate`). A request's
`output` (regex, choice, grammar or JSON schema) constrains each choice's text from its first token, read as
plain text (`ChatPipeline.output_constraint`), its grammar compiled off the event loop first
(`ChatPipeline.compile_output`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace

from jaxchat.api import shapes
from jaxchat.api.chunk_stream import ChunkStream
from jaxchat.api.pipeline import ChatPipeline, Generated
from jaxchat.api.request import CompletionRequest
from jaxchat.engine.types import GenerationRequest, SamplingParams

log = logging.getLogger("jaxchat")

__all__ = ["TextCompletions"]


class TextCompletions:
    def __init__(self, pipeline: ChatPipeline) -> None:
        self.pipeline = pipeline

    def _prepare(self, request: CompletionRequest) -> tuple[list[int], SamplingParams, str]:
        """(prompt ids, the engine's sampling parameters, the text `echo` puts first)."""
        p, prompt = self.pipeline, request.prompt
        ids = list(prompt) if isinstance(prompt, tuple) else p.encode(prompt, "prompt", True)
        ids = p.checked_prompt(ids, "prompt")
        p.check_output(request.output)
        echo = "" if not request.echo else prompt if isinstance(prompt, str) else p.tokenizer.decode(ids)
        return ids, p.sampling(request.sampling, len(ids)), echo

    def _requests(self, request: CompletionRequest, ids: list[int], sampling: SamplingParams) -> list[GenerationRequest]:
        output = request.output
        constraint = (lambda: self.pipeline.output_constraint(output)) if output is not None else None
        return self.pipeline.requests(ids, sampling, request.n, constraint)

    async def answer(self, request: CompletionRequest) -> dict:
        p = self.pipeline
        await p.compile_output(request.output)
        ids, sampling, echo = self._prepare(request)
        results = await asyncio.gather(*(p.collect(g) for g in self._requests(request, ids, sampling)))
        choices = [_choice(i, echo + r.text, r.finish_reason) for i, r in enumerate(results)]
        usage = shapes.usage(len(ids), sum(r.num_tokens for r in results),
                             cached_tokens=max(r.cached_tokens for r in results))
        return shapes.text_completion(shapes.new_id("cmpl"), p.model_id, choices, usage)

    def stream(self, request: CompletionRequest) -> ChunkStream:
        return ChunkStream(lambda stream: self._chunks(request, stream))

    async def _chunks(self, request: CompletionRequest, stream: ChunkStream) -> AsyncIterator[dict]:
        p = self.pipeline
        await p.compile_output(request.output)
        ids, sampling, echo = self._prepare(request)
        rid = shapes.new_id("cmpl")
        gens = self._requests(request, ids, sampling)
        queue: asyncio.Queue = asyncio.Queue()
        tasks = [asyncio.ensure_future(p.pump(i, g, queue)) for i, g in enumerate(gens)]
        generated, done, started, cached = [0] * len(gens), 0, [False] * len(gens), 0
        try:
            while done < len(gens):
                index, out = await queue.get()
                if isinstance(out, BaseException) or (out.finished and out.finish_reason == "error"):
                    log.error("request failed: %s", out if isinstance(out, BaseException) else out.error)
                    yield shapes.generation_failed()
                    return
                text = out.text if started[index] else echo + out.text
                started[index] = True
                generated[index] = out.num_generated_tokens or generated[index]
                cached = max(cached, out.num_cached_tokens)
                done += out.finished
                finish = out.finish_reason if out.finished else None
                yield shapes.text_completion(rid, p.model_id, [_choice(index, text, finish)], None, chunk=True)
            stream.usage = shapes.usage(len(ids), sum(generated), cached_tokens=cached)
            if request.include_usage:
                yield shapes.text_completion(rid, p.model_id, [], stream.usage, chunk=True)
        finally:
            for task in tasks:
                task.cancel()

    async def generate(self, request: CompletionRequest) -> Generated:
        await self.pipeline.compile_output(request.output)
        ids, sampling, _ = self._prepare(request)
        return await self.pipeline.collect(self._requests(replace(request, n=1), ids, sampling)[0])


def _choice(index: int, text: str, finish_reason: str | None) -> dict:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}
