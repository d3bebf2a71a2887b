"""Greedy generation through `jaxchat.LLM(model=dir).generate` on tiny random checkpoints of the families
proven by parity only (no real weights exist offline): 32 tokens alone equal the same prompt's tokens while
3 other requests join the batch mid-generation (continuous batching), and equal transformers' greedy
`generate`. Prompt plus output run past gpt_oss's sliding window of 8."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.engine.helpers import byte_tokenizer
from tests.models.conftest import build_tiny

VOCAB = 264  # the byte tokenizer's 263 tokens, rounded up; id 263 has no token and is never sampled
N = 32


@pytest.mark.parametrize("family", ["gpt_oss"])
def test_greedy_alone_batched_and_transformers_agree(family, tmp_path):
    import torch

    from jaxchat import LLM

    ref = build_tiny(family, tmp_path, vocab_size=VOCAB, eos_token_id=256)  # <|im_end|>, ignored below
    tok = byte_tokenizer()
    tok.eos_token = "<|im_end|>"
    tok.save_pretrained(tmp_path)
    ref.generation_config.eos_token_id = None
    prompt = [11, 12, 13, 14, 15, 16, 17]
    # (prompt, max_tokens, the step after which it is submitted): the first runs long, so the target joins a
    # running batch after step 2, and two more join while the target decodes
    others = [([5, 6, 7], 56, 0), (list(range(20, 45)), N, 4), ([9] * 11, N, 6)]
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=N, do_sample=False, suppress_tokens=[VOCAB - 1],
                            attention_mask=torch.ones(1, len(prompt), dtype=torch.long))[0, len(prompt):].tolist()
    llm = LLM(model=str(tmp_path), max_batch=4, max_context=64, max_step_tokens=64)  # few compiles
    try:
        alone = llm.generate(prompt, max_tokens=N, ignore_eos=True).token_ids
        engine = llm.service.engine
        # Joins by step count, not by sleeps: a request waits for its step's gate, and that step is held until
        # the request is queued, so every join lands mid-generation however loaded the machine is.
        gates = {after: threading.Event() for after in (2, 4, 6)}
        queued = threading.Semaphore(0)
        launch, submit, launched = engine.runner.launch, engine.submit, [0]

        def gated_launch(rows):
            launched[0] += 1
            if launched[0] in gates:
                gates[launched[0]].set()
                assert queued.acquire(timeout=120), f"no request queued after step {launched[0]}"
            return launch(rows)

        def queuing_submit(*args, **kwargs):
            rid = submit(*args, **kwargs)
            if launched[0] > 0:
                queued.release()
            return rid

        engine.runner.launch, engine.submit = gated_launch, queuing_submit

        def run(p, n, after):
            if after:
                assert gates[after].wait(timeout=120)
            return llm.generate(p, max_tokens=n, ignore_eos=True).token_ids

        steps = engine.stats().steps
        with ThreadPoolExecutor(4) as pool:
            joined = [pool.submit(run, *o) for o in others[:1]]
            target = pool.submit(run, prompt, N, 2)
            joined += [pool.submit(run, *o) for o in others[1:]]
            batched = target.result()
            assert [len(j.result()) for j in joined] == [n for _, n, _ in others]
        steps = engine.stats().steps - steps
    finally:
        llm.close()
    assert alone == want
    assert batched == alone
    assert steps < N + sum(n for _, n, _ in others)  # the requests shared steps (continuous batching)
