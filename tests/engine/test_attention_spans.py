"""Attention over a span of the cache: decoding with span buckets gives the same greedy tokens as always
reading the whole cache, across span boundaries and with rows of different lengths, and compiles
nothing after warm-up."""

from __future__ import annotations

import asyncio

from jaxchat.engine.compiles import compile_count
from jaxchat.engine.types import GenerationRequest, SamplingParams
from tests.tiny_model import tiny_chat_model


def _greedy(engine, prompts, max_tokens):
    async def one(i, prompt):
        req = GenerationRequest(list(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                                request_id=f"r{i}")
        return [t async for o in engine.generate(req) for t in o.token_ids]

    async def main():
        return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))

    return asyncio.run(main())


def test_span_buckets_match_the_whole_cache(tmp_path_factory):
    from jaxchat.engine.engine import Engine
    from jaxchat.models import load_model

    model = load_model(tiny_chat_model(tmp_path_factory.mktemp("spans")))
    # rows start below the 16-position span and end past the 32 one; one row starts late (longer prompt)
    prompts = [list(range(1000, 1005)), list(range(2000, 2011)), list(range(3000, 3020))]
    outputs = {}
    for spans in ((64,), (16, 32, 64)):
        engine = Engine(model, max_batch=4, max_context=64, span_buckets=spans, min_prefill_bucket=8)
        try:
            assert engine.runner.span_buckets == spans
            before = compile_count()
            outputs[spans] = _greedy(engine, prompts, 30)
            assert compile_count() == before, "decoding compiled after warm-up"
        finally:
            engine.shutdown()
    assert outputs[(16, 32, 64)] == outputs[(64,)]
    assert all(len(o) == 30 for o in outputs[(64,)])
