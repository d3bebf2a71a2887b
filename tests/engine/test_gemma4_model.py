"""Gemma 4 (text) through the engine: a tiny random checkpoint (sliding and full layers of different shapes,
KV-shared layers, per-layer inputs, the MoE block; `tests/models/conftest.build_tiny`) generates greedily
through `jaxchat.LLM(model=dir).generate` the same 32 tokens as transformers, and the same tokens again
while other requests join and leave the batch (continuous batching, the scheduler driven step by step)."""

from __future__ import annotations

from tests.engine.helpers import byte_tokenizer
from tests.engine.test_real_model import greedy, isolation_plan, run_plan
from tests.models.conftest import build_tiny

VOCAB = 264  # the byte tokenizer's 263 tokens, padded; id 263 is never sampled (not a token)


def test_tiny_gemma4_generate_equals_transformers_alone_and_batched(tmp_path):
    import torch

    from jaxchat import LLM
    from jaxchat.engine.engine import Engine

    tok = byte_tokenizer()
    tok.eos_token = "<|im_end|>"
    ref = build_tiny("gemma4_text", tmp_path, vocab_size=VOCAB, vocab_size_per_layer_input=VOCAB,
                     eos_token_id=tok.eos_token_id, bos_token_id=None, pad_token_id=None)
    tok.save_pretrained(tmp_path)
    prompt = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]  # the window of 8 is passed during the prompt
    ids = list(prompt)
    with torch.no_grad():  # greedy by hand: no stop on eos (generate ignores it below), id 263 never sampled
        for _ in range(32):
            logits = ref(torch.tensor([ids])).logits[0, -1]
            logits[VOCAB - 1] = -float("inf")
            ids.append(int(logits.argmax()))
    want = ids[len(prompt):]
    buckets = {"decode_rows": (4,), "max_step_tokens": 64}  # few programs to compile
    llm = LLM(model=str(tmp_path), max_batch=4, max_context=64, **buckets)
    try:
        assert llm.generate(prompt, max_tokens=32, ignore_eos=True).token_ids == want
        model = llm.service.engine.model
    finally:
        llm.close()
    # the same model in an engine driven by hand: the prompt alone, then joined by three others (one aborted)
    engine = Engine(model, max_batch=4, max_context=64, start=False, **buckets)
    alone = run_plan(engine, {0: [("submit", greedy("p", prompt, 32))]})["p"]
    mixed = run_plan(engine, isolation_plan(prompt, 32))
    assert alone == want and mixed["p"] == want
    assert engine.stats().compiles_on_request_path == 0
