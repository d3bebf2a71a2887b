"""Decode throughput: jaxchat vs transformers `generate`, side by side in one run.

For each model (GGUFs via `jaxchat.assets.asset_path`): the same chat prompt, fp32, greedy, N new tokens
(eos ignored on both sides). Prints transformers' and jaxchat's tokens/s at batch 1 and their ratio,
jaxchat's aggregate tokens/s at batch 1, 4 and 16 and the ratio to batch 1, how many of the greedy tokens
agree, and the fraction of the memory-bandwidth bound at batch 1: achieved tokens/s divided by
(measured numpy copy bandwidth / weight bytes read per step).  The copy bandwidth counts bytes read plus
bytes written.  Batch-1 timings against transformers include the prefill (the same prompt on both
sides; the median of --repeats runs on each side). Every jaxchat batch size is the median of --repeats
runs too. Aggregates are printed twice: decode (the steady state while all rows decode, prefills
excluded, as llama.cpp's batched-bench separates text generation from prompt processing) and end to end.

    python bench/decode.py [--models smollm2,qwen2.5-0.5b] [--new-tokens 128] [--batches 1,4,16]
    python bench/decode.py --random-config qwen3-8b --dtype bfloat16   # random weights, jaxchat only
    python bench/decode.py --random-config deltanet-small,attention-small --contexts 128,2048
    python bench/decode.py --quantize int8 --no-transformers   # int8 (W8A8) beside fp32, with the ratios

With --quantize int8 each model runs twice in the same process, fp32 then int8 weights (quantised at load),
and a last table gives int8's tokens/s over fp32's at every batch size.

With --contexts, each random config decodes at batch 1 after prompts of those lengths: the step time per
context and its ratio to the shortest, side by side (a model whose layers are all Gated DeltaNet keeps a
fixed-size state, so its step time does not grow with the context; full attention reads the whole KV cache).

With --against DIR (a checkout of another commit, e.g. `git worktree add /tmp/prev <commit>`), the same
measurement (--models, --batches, --new-tokens, --repeats; transformers left out) runs --rounds times for this
checkout and for that one, alternating, each round in its own process, and a last table gives this checkout's
decode and end-to-end tokens/s over that one's at every batch size (medians over the rounds):

    python bench/decode.py --models qwen2.5-0.5b --batches 1,16 --against /tmp/prev --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from pathlib import Path

import numpy as np

MODELS = {
    "smollm2": "smollm2-135m-instruct-q4_1.gguf",
    "qwen2.5-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}
RANDOM_CONFIGS = {
    "qwen3-8b": {"family": "qwen3", "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 12288, "num_layers": 36,
                     "num_heads": 32, "num_kv_heads": 8, "head_dim": 128, "rope_theta": 1e6, "qk_norm": True},
    "qwen2.5-0.5b": {"family": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_layers": 24,
                         "num_heads": 14, "num_kv_heads": 2, "head_dim": 64, "rope_theta": 1e6, "attention_bias": True,
                         "tie_word_embeddings": True},
}
SMALL = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1536, "num_layers": 8, "num_heads": 8,
         "num_kv_heads": 2, "head_dim": 64, "rope_theta": 1e6, "qk_norm": True}
RANDOM_CONFIGS["deltanet-small"] = {**SMALL, "family": "qwen3_5_text", "layer_types": ("linear_attention",) * 8,
                                    "partial_rotary_factor": 0.25, "linear_num_key_heads": 4,
                                    "linear_num_value_heads": 8, "linear_key_head_dim": 64, "linear_value_head_dim": 64}
RANDOM_CONFIGS["attention-small"] = {**SMALL, "family": "qwen3"}  # the same size, every layer full attention
PROMPT = "Write a short story about a robot who learns to paint."


def copy_bandwidth(nbytes: int = 256 << 20, reps: int = 5) -> float:
    a = np.ones(nbytes // 8, np.float64)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return 2 * nbytes / best


def weight_bytes_per_step(model) -> int:
    """Bytes of parameters read by one decode step (the embedding table only when it is also the lm head)."""
    import jax

    def nbytes(tree):
        return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))

    total = nbytes(model.params)
    if not model.config.tie_word_embeddings:
        total -= nbytes(model.params["embed"])  # only the looked-up rows are read
    return total


def run_jaxchat(engine, prompt_ids, new_tokens: int, batch: int) -> tuple[float, float, list[int]]:
    """(end-to-end aggregate tokens/s including the prefills, decode aggregate tokens/s, first output).

    The decode aggregate counts the tokens all `batch` requests generated while every one of them was
    decoding (from the last first token to the first last token), over that window: the steady-state
    rate of a full batch, as llama.cpp's batched-bench reports text generation apart from prompt
    processing. At batch 1 it is the rate after the first token."""
    from jaxchat.engine.types import GenerationRequest, SamplingParams

    async def one(i):
        req = GenerationRequest(list(prompt_ids), SamplingParams(max_tokens=new_tokens, ignore_eos=True),
                                request_id=f"b{batch}-{i}")
        toks, times = [], []
        async for o in engine.generate(req):
            toks += o.token_ids
            times += [time.perf_counter()] * len(o.token_ids)
        return toks, times

    async def main():
        return await asyncio.gather(*(one(i) for i in range(batch)))

    t = time.perf_counter()
    outs = asyncio.run(main())
    dt = time.perf_counter() - t
    assert all(len(toks) == new_tokens for toks, _ in outs)
    start = max(times[0] for _, times in outs)
    end = min(times[-1] for _, times in outs)
    inside = sum(1 for _, times in outs for x in times if start < x <= end)
    decode_rate = inside / (end - start) if end > start and inside else float("nan")
    return sum(len(toks) for toks, _ in outs) / dt, decode_rate, outs[0][0]


def run_transformers(path, prompt_ids, new_tokens: int, repeats: int = 1) -> tuple[float, list[int]]:
    """Median tokens/s of `repeats` greedy `generate` calls (after a 4-token warm-up), and the tokens."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    # The same dequantised GGUF weights, loaded without `accelerate` (which `from_pretrained(gguf_file=)` needs).
    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise RuntimeError(f"transformers GGUF load: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    ids = torch.tensor([list(prompt_ids)])
    kw = {"do_sample": False, "pad_token_id": 0}
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)
        rates = []
        for _ in range(repeats):
            t = time.perf_counter()
            out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
            rates.append(new_tokens / (time.perf_counter() - t))
    return float(np.median(rates)), out[0, ids.shape[1]:].tolist()


def context_for(n: int) -> int:
    c = 64
    while c < n:
        c *= 2
    return c


def bench_model(name: str, model, path, args, bw: float) -> None:
    from jaxchat.engine.engine import Engine

    tok = model.tokenizer
    if tok is not None:
        text = tok.apply_chat_template([{"role": "user", "content": PROMPT}],
                                       add_generation_prompt=True, tokenize=False)
        prompt = tok.encode(text, add_special_tokens=False)
    else:
        prompt = list(range(100, 130))
    batches = [int(b) for b in args.batches.split(",")]
    t = time.perf_counter()
    # plain decode: every program compiled before timing, no drafts (engine.config's defaults would add both)
    engine = Engine(model, max_batch=max(batches), max_context=context_for(len(prompt) + args.new_tokens + 1),
                    step_token_buckets=(64, 256), programs="all", speculative="off")
    print(f"[{name}] prompt {len(prompt)} tokens; engine ready (warm-up compile) in {time.perf_counter() - t:.1f}s")
    rates, decode_rates = {}, {}
    try:
        run_jaxchat(engine, prompt, 8, 1)  # first-request effects (allocation) out of the timing
        first = None
        for b in batches:
            runs = [run_jaxchat(engine, prompt, args.new_tokens, b) for _ in range(args.repeats)]
            rates[b] = float(np.median([r[0] for r in runs]))
            decode_rates[b] = float(np.median([r[1] for r in runs]))
            first = runs[0][2] if first is None else first
        compiles = engine.stats().compiles_on_request_path
    finally:
        engine.shutdown()
    wbytes = weight_bytes_per_step(model)
    bound = bw / wbytes
    print(f"[{name}] weights read per step {wbytes / 1e6:.0f} MB; copy bandwidth {bw / 1e9:.1f} GB/s -> "
          f"bound {bound:.1f} tok/s at batch 1")
    if path is not None and not args.no_transformers:
        hf_rate, hf_toks = run_transformers(path, prompt, args.new_tokens, args.repeats)
        agree = next((i for i, (a, b) in enumerate(zip(first, hf_toks, strict=False)) if a != b), len(hf_toks))
        print(f"[{name}] batch 1: transformers {hf_rate:.1f} tok/s, jaxchat {rates[batches[0]]:.1f} tok/s, "
              f"ratio {rates[batches[0]] / hf_rate:.2f}x; greedy tokens agree for the first {agree}/{len(hf_toks)}")
    base, dbase = rates[batches[0]], decode_rates[batches[0]]
    for b in batches:
        print(f"[{name}] jaxchat batch {b:>2}: decode {decode_rates[b]:8.1f} tok/s aggregate, "
              f"{decode_rates[b] / dbase:.2f}x batch {batches[0]}; end to end with the {b} prefills "
              f"{rates[b]:8.1f} tok/s, {rates[b] / base:.2f}x")
    print(f"[{name}] batch {batches[0]}: {base / bound:.0%} of the memory-bandwidth bound; "
          f"compiles after warm-up: {compiles}")
    return rates, decode_rates


def print_ratios(name: str, fp32, int8, batches) -> None:
    """int8 over fp32 tokens/s per batch size (decode aggregate and end to end), from `bench_model`'s rates."""
    for b in batches:
        print(f"[{name}] batch {b:>2}: decode fp32 {fp32[1][b]:8.1f}, int8 {int8[1][b]:8.1f} tok/s -> "
              f"{int8[1][b] / fp32[1][b]:.2f}x; end to end fp32 {fp32[0][b]:8.1f}, int8 {int8[0][b]:8.1f} -> "
              f"{int8[0][b] / fp32[0][b]:.2f}x")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,qwen2.5-0.5b", help=f"comma list of {list(MODELS)}")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--random-config", help=f"random weights of a real shape: comma list of {sorted(RANDOM_CONFIGS)}")
    ap.add_argument("--contexts", help="comma list of prompt lengths: batch-1 decode step time at each (random configs)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--quantize", choices=["int8"], help="also run each model with int8 weights (W8A8), same run")
    ap.add_argument("--repeats", type=int, default=3, help="runs per side and batch size; the median is reported")
    ap.add_argument("--against", default=None, metavar="DIR", help="another checkout, measured in the same run")
    ap.add_argument("--rounds", type=int, default=3, help="with --against: alternating rounds per checkout")
    args = ap.parse_args(argv)
    if args.against:
        return against(args)
    sys.stdout.reconfigure(line_buffering=True)
    from jaxchat.engine.host_memory import keep_freed_memory

    print(f"malloc keeps freed memory (as jaxchat serve): {keep_freed_memory()}")  # both sides share it
    import jax

    print(f"devices: {jax.devices()}")
    bw = copy_bandwidth()
    if args.random_config:
        names = args.random_config.split(",")
        unknown = [n for n in names if n not in RANDOM_CONFIGS]
        if unknown:
            ap.error(f"--random-config {unknown[0]!r}: not one of {sorted(RANDOM_CONFIGS)}")
        if args.contexts:
            contexts = [int(c) for c in args.contexts.split(",")]
            rows = [context_scaling(n, random_model(n, args.dtype), contexts, args) for n in names]
            print(f"{'model':>18} " + " ".join(f"{c:>8}-ctx ms" for c in contexts) + "   ratio")
            for n, ms in rows:
                print(f"{n:>18} " + " ".join(f"{m:>11.2f}" for m in ms) + f"   {ms[-1] / ms[0]:.2f}x")
            return
        for n in names:
            bench_model(n, random_model(n, args.dtype), None, args, bw)
        return
    from jaxchat.assets import asset_path
    from jaxchat.models import load_model

    batches = [int(b) for b in args.batches.split(",")]
    for name in args.models.split(","):
        path = asset_path(MODELS[name])
        fp32 = bench_model(name, load_model(path, args.dtype, None), path, args, bw)
        if args.quantize:
            args_q = argparse.Namespace(**{**vars(args), "no_transformers": True})
            quant = bench_model(f"{name} {args.quantize}", load_model(path, args.dtype, None, quantize=args.quantize),
                                None, args_q, bw)
            print_ratios(f"{name} {args.quantize} / {args.dtype}", fp32, quant, batches)


LINE = re.compile(r"^\[(?P<model>[^\]]+)\] jaxchat batch +(?P<batch>\d+): decode +(?P<decode>[\d.]+) tok/s .*"
                  r"end to end with the \d+ prefills +(?P<e2e>[\d.]+) tok/s")


def against(args) -> None:
    """Alternate rounds of this checkout's and another's bench/decode.py (each in its own process, with its own
    sources on PYTHONPATH) and print the ratios of their medians."""
    import os
    import subprocess

    here = Path(__file__).resolve().parents[1]
    roots = {"this": here, "other": Path(args.against).resolve()}
    common = ["--models", args.models, "--batches", args.batches, "--new-tokens", str(args.new_tokens),
              "--repeats", str(args.repeats), "--no-transformers"]
    found: dict[str, dict] = {name: {} for name in roots}
    for r in range(args.rounds):
        for name, root in roots.items():
            env = {**os.environ, "PYTHONPATH": str(root)}
            proc = subprocess.run([sys.executable, str(root / "bench" / "decode.py"), *common], cwd=root, env=env,
                                  capture_output=True, text=True, check=False)
            if proc.returncode:
                raise SystemExit(f"{name} ({root}) failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
            for line in proc.stdout.splitlines():
                m = LINE.match(line)
                if m:
                    key = (m["model"], int(m["batch"]))
                    found[name].setdefault(key, []).append((float(m["decode"]), float(m["e2e"])))
                    print(f"round {r + 1} {name:>5}: {line}")
    print(f"this: {roots['this']}\nother: {roots['other']}")
    for key in sorted(found["this"]):
        mine, theirs = np.array(found["this"][key]), np.array(found["other"].get(key, [[np.nan, np.nan]]))
        d, e = np.median(mine, axis=0), np.median(theirs, axis=0)
        print(f"[{key[0]}] batch {key[1]:>2}: decode {d[0]:8.1f} vs {e[0]:8.1f} tok/s -> this / other "
              f"{d[0] / e[0]:.2f}x; end to end {d[1]:8.1f} vs {e[1]:8.1f} -> {d[1] / e[1]:.2f}x "
              f"(rounds: this {', '.join(f'{x:.1f}' for x in mine[:, 0])}; other "
              f"{', '.join(f'{x:.1f}' for x in theirs[:, 0])})")


def context_scaling(name: str, model, contexts: list[int], args) -> tuple[str, list[float]]:
    """Batch-1 decode step time (ms, median of --repeats) after a prompt of each length in `contexts`."""
    from jaxchat.engine.engine import Engine

    t = time.perf_counter()
    engine = Engine(model, max_batch=1, max_context=context_for(max(contexts) + args.new_tokens + 1), programs="all",
                    speculative="off")
    print(f"[{name}] engine ready (warm-up compile) in {time.perf_counter() - t:.1f}s")
    rng = np.random.default_rng(0)
    ms = []
    try:
        for c in contexts:
            prompt = rng.integers(0, model.config.vocab_size, c).tolist()
            run_jaxchat(engine, prompt, 4, 1)  # first-request effects out of the timing
            rates = [run_jaxchat(engine, prompt, args.new_tokens, 1)[1] for _ in range(args.repeats)]
            ms.append(1000.0 / float(np.median(rates)))
            print(f"[{name}] context {c}: decode step {ms[-1]:.2f} ms")
        assert engine.stats().compiles_on_request_path == 0
    finally:
        engine.shutdown()
    return name, ms


def random_model(name: str, dtype: str):
    return random_model_of(RANDOM_CONFIGS[name], dtype, source=f"random:{name}")


def random_model_of(config: dict, dtype: str, source: str = "random"):
    """A `LoadedModel` of `config` (`ModelConfig` fields) with normal(0, 0.02) weights, seed 0
    (`jaxchat.engine.smoke.random_model`, the engine warm-up's random model)."""
    from jaxchat.engine.smoke import random_model as random_weights
    from jaxchat.models import ModelConfig

    return random_weights(ModelConfig(**config), dtype, source=source)


if __name__ == "__main__":
    main()
