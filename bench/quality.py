"""Int8 quality: perplexity and greedy agreement, fp32 vs int8 (W8A8) weights of the same model, one run.

Perplexity is over a fixed text anyone has offline: the source (code and docstrings) of a few Python
standard-library modules, read from the running interpreter, cut to --tokens tokens and scored in windows of
--window tokens (each window from scratch). Greedy agreement: for each of 20 chat prompts, both models
generate --new-tokens greedily; printed is the mean number of tokens until the first difference (and how
many prompts agree throughout).

    python bench/quality.py [--model qwen2.5-0.5b] [--tokens 8192] [--window 512] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import functools
import inspect
import sys
import time

import numpy as np

MODELS = {"smollm2": "smollm2-135m-instruct-q4_1.gguf", "qwen2.5-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"}
SOURCES = ("textwrap", "string", "bisect", "heapq", "fnmatch", "shlex", "colorsys", "calendar")
PROMPTS = (
    "Write a Python function that reverses a linked list.",
    "Explain what a hash map is in two sentences.",
    "What is the difference between a list and a tuple in Python?",
    "Write a SQL query that counts orders per customer.",
    "How do I read a CSV file with pandas?",
    "Write a bash one-liner that counts lines in all .py files.",
    "What does the `yield` keyword do?",
    "Give three tips for writing readable code.",
    "Write a JavaScript function that debounces another function.",
    "Explain big-O notation briefly.",
    "Write a Python class for a stack with push, pop and peek.",
    "What is a race condition?",
    "Write a regular expression that matches an email address.",
    "How does binary search work?",
    "Write a Rust function that sums a vector of integers.",
    "What is the purpose of a virtual environment in Python?",
    "Write a C function that computes the length of a string.",
    "Explain the difference between TCP and UDP.",
    "Write a Python decorator that times a function.",
    "What is recursion? Give a short example.",
)


def corpus_text() -> str:
    import importlib

    return "\n\n".join(inspect.getsource(importlib.import_module(m)) for m in SOURCES)


def perplexity(model, params_fn, ids: list[int], window: int) -> float:
    """exp(mean next-token negative log-likelihood) over `ids`, scored in windows of `window` tokens."""
    import jax
    import jax.numpy as jnp

    from jaxchat.engine.attention_xla import XlaAttention
    from jaxchat.engine.step import uniform_inputs

    backend = XlaAttention(16)
    fwd = jax.jit(functools.partial(model.forward, backend=backend, uniform=(1, window)))
    inputs = jax.tree.map(jnp.asarray, uniform_inputs(1, window, 16))
    nll, count = 0.0, 0
    for start in range(0, len(ids) - window + 1, window):
        chunk = np.asarray(ids[start:start + window], np.int32)
        pools = model.new_pools(backend, 1 + inputs.page_tables.size, 16, 1)
        logits = fwd(params_fn, jnp.asarray(chunk), pools, inputs)[0]
        logp = jax.nn.log_softmax(logits[:-1], axis=-1)
        nll -= float(jnp.sum(jnp.take_along_axis(logp, jnp.asarray(chunk[0, 1:])[:, None], axis=1)))
        count += window - 1
    return float(np.exp(nll / count))


def greedy_outputs(model, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """Greedy continuations of all prompts, decoded as one batch (rows are independent: batch isolation)."""
    from jaxchat.engine.engine import Engine
    from jaxchat.engine.types import GenerationRequest, SamplingParams

    longest = max(len(p) for p in prompts) + new_tokens + 1
    context = 64
    while context < longest:
        context *= 2
    n = len(prompts)
    engine = Engine(model, max_batch=n, max_context=context, start=False, decode_rows=(n,),
                    step_token_buckets=(context // 2,), programs="all", speculative="off")
    try:
        outs: list[list[int]] = [[] for _ in prompts]
        for i, p in enumerate(prompts):
            engine.scheduler.submit(GenerationRequest(list(p), SamplingParams(max_tokens=new_tokens, ignore_eos=True),
                                                      None, f"q{i}"), lambda o, got=outs[i]: got.extend(o.token_ids))
        while engine.core.has_work():
            engine.core.step()
        return outs
    finally:
        engine.shutdown()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-0.5b", choices=list(MODELS))
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    from jaxchat.assets import asset_path
    from jaxchat.models import load_model

    path = asset_path(MODELS[args.model])
    results = {}
    for label, quantize in (("fp32", None), ("int8", "int8")):
        t = time.perf_counter()
        model = load_model(path, "float32", None, quantize=quantize)
        tok = model.tokenizer
        ids = tok.encode(corpus_text(), add_special_tokens=False)[:args.tokens]
        ppl = perplexity(model, model.params, ids, args.window)
        prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                      tokenize=False), add_special_tokens=False) for p in PROMPTS]
        results[label] = (ppl, greedy_outputs(model, prompts, args.new_tokens))
        print(f"[{args.model} {label}] perplexity {ppl:.3f} over {len(ids) // args.window * args.window} tokens "
              f"of stdlib source ({time.perf_counter() - t:.0f}s)")
        del model
    (p32, g32), (p8, g8) = results["fp32"], results["int8"]
    firsts = [next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), len(x)) for x, y in zip(g32, g8, strict=True)]
    print(f"[{args.model}] perplexity fp32 {p32:.3f}, int8 {p8:.3f}: int8 {100 * (p8 / p32 - 1):+.2f}%")
    print(f"[{args.model}] greedy agreement over {len(PROMPTS)} chat prompts: mean {np.mean(firsts):.1f} of "
          f"{args.new_tokens} tokens until the first difference; {sum(f == args.new_tokens for f in firsts)} "
          f"prompts identical throughout")


if __name__ == "__main__":
    main()
