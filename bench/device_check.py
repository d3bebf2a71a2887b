"""The device check: what the engine does on the accelerator JAX finds (bench/device_check.sh runs it).

For the default model (Qwen2.5-Coder-0.5B, its GGUF weights) and a random-weight dense config of about 1.5B
parameters (Qwen2.5-1.5B's shape; `--models qwen3-1.7b` adds one whose 8 kv heads divide 1, 2, 4 or 8 chips, so
the Pallas kernel runs under shard_map), in bfloat16 on an accelerator (float32 on CPU), through the engine as it
serves (paged pool, ragged step, overlapped loop), on one chip, then on all chips (when there are several), each
with `--attention xla` and with `pallas` where the kernel runs the model there (TPU only; the line says why not):
- each program's compile time at start-up (`Engine.warmup_seconds`) and every chip's `memory_stats()` after it
  (in use, peak, limit; "not reported" where the platform gives none, as CPU);
- decode tokens/s at batch 1, 16 and 64 (the steady rate while every row decodes, `bench/decode.py`'s measure)
  and, at batch 1, the fraction of the memory-bandwidth bound (tokens/s over bandwidth / weight bytes a step
  reads; the bandwidth from a table of device kinds times the chips of that run (each reads its share of the
  weights), or measured with a copy on CPU);
- TTFT of a 512-token prompt at batch 1 (median of 3, each a new prompt);
- on all chips, with the attention `auto` picks, the default model's step time at 16 rows with a JSON schema on
  every row against unconstrained rows;
- per chip count, pallas against xla (decode tok/s at each batch and TTFT, as ratios).
Prints one block per model, chip count and attention, and a last line `device check: ok`. `--smoke` is a reduced
run for CI on CPU: SmolLM2 only, batches 1 and 2, few tokens, a 256-token context, one 64-token step bucket and
one 2-row decode bucket (three programs), no 1.5B config.

    python bench/device_check.py [--smoke] [--new-tokens 64] [--batches 1,16,64] [--models default,dense-1.5b]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# HBM bandwidth by device kind (bytes/s), from the vendors' data sheets
BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "L4": 0.3e12, "TPU v4": 1.2e12, "TPU v5 lite": 0.82e12,
             "TPU v5e": 0.82e12, "TPU v5p": 2.76e12, "TPU v6 lite": 1.64e12, "TPU v6e": 1.64e12}
DENSE_1_5B = {"family": "qwen2", "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960, "num_layers": 28,
              "num_heads": 12, "num_kv_heads": 2, "head_dim": 128, "rope_theta": 1e6, "attention_bias": True,
              "tie_word_embeddings": True}
QWEN3_1_7B = {"family": "qwen3", "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_layers": 28,
              "num_heads": 16, "num_kv_heads": 8, "head_dim": 128, "rope_theta": 1e6, "qk_norm": True,
              "tie_word_embeddings": True}
RANDOM_CONFIGS = {"dense-1.5b": DENSE_1_5B, "qwen3-1.7b": QWEN3_1_7B}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}},
          "required": ["answer", "score"]}


def bandwidth(device) -> tuple[float, str]:
    kind = getattr(device, "device_kind", "")
    for name, bw in BANDWIDTH.items():
        if name.lower() in kind.lower():
            return bw, f"{kind} (data sheet)"
    from bench.decode import copy_bandwidth

    return copy_bandwidth(), f"{kind or device.platform} (measured copy)"


def ttft(engine, length: int, repeats: int = 3) -> float:
    from jaxchat.engine.types import GenerationRequest, SamplingParams

    async def first(i: int) -> float:
        prompt = [(97 * i + 13 * j) % 20000 + 300 for j in range(length)]
        t0 = time.perf_counter()
        async for _ in engine.generate(GenerationRequest(prompt, SamplingParams(max_tokens=1, ignore_eos=True))):
            return time.perf_counter() - t0
        return float("nan")

    return statistics.median(asyncio.run(first(i)) for i in range(repeats))


def step_time(engine, rows: int, tokens: int, constrained: bool) -> float:
    """Mean seconds per step while `rows` requests decode `tokens` tokens (a JSON schema on each, or none)."""
    from jaxchat.chat import chat_constraint_request_from_openai, chat_format_detect
    from jaxchat.constrain import GrammarEngine
    from jaxchat.engine.types import GenerationRequest, SamplingParams

    tok = engine.tokenizer
    spec = chat_format_detect(tok.chat_template, lambda s: s in tok.get_vocab())
    grammar = GrammarEngine(tok, vocab_size=engine.model.config.vocab_size)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}}

    async def run() -> float:
        async def one(i: int):
            c = grammar.make(spec, chat_constraint_request_from_openai(body), "") if constrained else None
            req = GenerationRequest([300 + i, 400, 500], SamplingParams(max_tokens=tokens, ignore_eos=True), c)
            async for _ in engine.generate(req):
                pass

        steps = engine.stats().steps
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(rows)))
        return (time.perf_counter() - t0) / max(1, engine.stats().steps - steps)

    return asyncio.run(run())


def chip_counts(devices: int) -> list[int]:
    """One chip, then all of them (one run when there is one)."""
    return [1] if devices == 1 else [1, devices]


def attentions(config, platform: str, chips: int, dtype: str) -> tuple[list[str], str | None]:
    """The attention paths to run on `chips` chips: xla, and pallas where the kernel runs the model there (on TPU
    only: elsewhere it is Pallas' interpreter); with why pallas is not run."""
    from jaxchat.engine.engine import attention_choice

    if platform != "tpu":
        return ["xla"], f"pallas is a TPU kernel (on {platform} only its interpreter runs)"
    try:
        chosen, why = attention_choice("pallas", config, platform, chips, dtype)
    except ValueError as exc:
        return ["xla"], str(exc)
    return (["xla", "pallas"], None) if chosen == "pallas" else (["xla"], why)


def memory_lines(devices) -> list[str]:
    """Each chip's `memory_stats()` (in use, peak, limit), or one line saying the platform reports none."""
    gib, out = 1 << 30, []
    for d in devices:
        stats = d.memory_stats()
        if not stats:
            return [f"memory_stats: not reported on {d.platform}"]
        out.append(f"memory_stats {d}: in use {stats.get('bytes_in_use', 0) / gib:.2f} GiB, peak "
                   f"{stats.get('peak_bytes_in_use', 0) / gib:.2f} GiB of {stats.get('bytes_limit', 0) / gib:.2f} GiB")
    return out


def check(name: str, make_model, args, batches: list[int], constrained_rows: int, chips: int, attention: str,
          max_context: int = 1024, **engine_options) -> dict[str, float]:
    """One engine on the first `chips` devices with `attention`: its figures printed, and returned by name."""
    import textwrap

    import jax

    from bench.decode import run_jaxchat, weight_bytes_per_step
    from jaxchat.engine.engine import Engine
    from jaxchat.engine.step import make_mesh

    model = make_model()
    per_step = weight_bytes_per_step(model)
    params = sum(x.size for x in jax.tree.leaves(model.params))
    devices = jax.devices()[:chips]
    t0 = time.perf_counter()
    engine = Engine(model, max_batch=max(batches), max_context=max_context, mesh=make_mesh(devices),
                    attention=attention, **{"programs": "all", "speculative": "off", **engine_options})
    ready = time.perf_counter() - t0
    bw, source = bandwidth(devices[0])
    if devices[0].platform != "cpu" and chips > 1:  # each chip reads its share of the weights: all chips' bandwidth
        bw, source = bw * chips, f"{source}, x {chips} chips"
    print(f"\n== {name} on {chips} {devices[0].platform} chip(s): {params / 1e9:.2f}B parameters, {model.dtype}, "
          f"attention {engine.runner.backend.name}, ready in {ready:.0f} s ==")
    times = engine.warmup_seconds
    print(textwrap.fill(f"compile (s), {len(times)} programs, {sum(times.values()):.1f} s in all: "
                        + ", ".join(f"{k.name} {s:.2f}" for k, s in times.items()), 118,
                        subsequent_indent="  "))
    for line in memory_lines(devices):
        print(line)
    print(f"bandwidth {bw / 1e9:.0f} GB/s ({source}); weights read per step {per_step / 1e9:.2f} GB: "
          f"bound {bw / per_step:.0f} tok/s at batch 1")
    figures: dict[str, float] = {}
    prompt = [300 + (7 * j) % 5000 for j in range(32)]
    for b in batches:
        _, decode_rate, _ = run_jaxchat(engine, prompt, args.new_tokens, b)
        figures[f"decode batch {b}"] = decode_rate
        extra = f"  ({decode_rate / (bw / per_step):.0%} of the bandwidth bound)" if b == 1 else ""
        print(f"decode batch {b:>3}: {decode_rate:9.1f} tok/s{extra}")
    figures["TTFT"] = ttft(engine, args.prompt_tokens)
    print(f"TTFT, {args.prompt_tokens}-token prompt, batch 1: {1000 * figures['TTFT']:.1f} ms")
    if constrained_rows and engine.tokenizer is not None:
        free = step_time(engine, constrained_rows, args.new_tokens, constrained=False)
        json_ = step_time(engine, constrained_rows, args.new_tokens, constrained=True)
        print(f"step at {constrained_rows} rows: unconstrained {1000 * free:.2f} ms, JSON schema on every row "
              f"{1000 * json_:.2f} ms ({json_ / free:.2f}x)")
    engine.shutdown()
    return figures


def check_model(name: str, make_model, args, batches: list[int], constrained_rows: int, **options) -> None:
    """`check` on one chip, then all chips, each attention path that runs there; then pallas against xla."""
    import jax

    config, platform = make_model.config, jax.devices()[0].platform
    for chips in chip_counts(len(jax.devices())):
        paths, why = attentions(config, platform, chips, make_model.dtype)
        auto = "pallas" if "pallas" in paths else "xla"  # what `--attention auto` runs there
        figures = {a: check(name, make_model, args, batches, constrained_rows if chips == len(jax.devices())
                            and a == auto else 0, chips, a, **options) for a in paths}
        if why is not None:
            print(f"{name} on {chips} chip(s): pallas not run: {why}")
        else:
            ratio = {k: figures["pallas"][k] / figures["xla"][k] for k in figures["xla"]}
            print(f"{name} on {chips} chip(s), pallas against xla: tok/s " + ", ".join(
                f"{ratio[k]:.2f}x at {k.removeprefix('decode ')}" for k in ratio if k != "TTFT")
                + f"; TTFT {ratio['TTFT']:.2f}x (a time: below 1 is faster)")


class ModelMaker:
    """A fresh model for each engine (an engine on the kernel's path takes its weights over), with its config and
    dtype at hand without building one."""

    def __init__(self, build, config, dtype: str) -> None:
        self.build, self.config, self.dtype = build, config, dtype

    def __call__(self):
        return self.build()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="a reduced run (CPU, CI): SmolLM2, batches 1 and 2")
    ap.add_argument("--models", default="default,dense-1.5b", help="of default, dense-1.5b, qwen3-1.7b")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    args = ap.parse_args()
    import jax

    from bench.decode import random_model_of
    from jaxchat.assets import DEFAULT_MODEL, asset_path
    from jaxchat.models import ModelConfig, load_model

    platform = jax.devices()[0].platform
    dtype = "float32" if platform == "cpu" else "bfloat16"
    print(f"devices: {jax.devices()} (jax {jax.__version__})")

    def gguf(name: str) -> ModelMaker:
        path = asset_path(name)
        first = load_model(path, dtype)
        models = [first]  # the first build is the one already loaded (its config read)
        return ModelMaker(lambda: models.pop() if models else load_model(path, dtype), first.config, dtype)

    def random(name: str, config: dict) -> ModelMaker:
        return ModelMaker(lambda: random_model_of(config, dtype, f"random:{name}"), ModelConfig(**config), dtype)

    if args.smoke:
        args.new_tokens, args.prompt_tokens = min(args.new_tokens, 8), min(args.prompt_tokens, 64)
        check_model("smollm2-135m (smoke)", gguf("smollm2-135m-instruct-q4_1.gguf"), args, [1, 2], 2,
                    max_context=256, step_token_buckets=(64,), decode_rows=(2,))  # three programs
    else:
        batches = [int(b) for b in args.batches.split(",")]
        for name in args.models.split(","):
            if name == "default":
                check_model("qwen2.5-coder-0.5b", gguf(DEFAULT_MODEL), args, batches, 16)
            elif name in RANDOM_CONFIGS:
                check_model(f"{name} (random weights)", random(name, RANDOM_CONFIGS[name]), args, batches, 0)
            else:
                raise SystemExit(f"device_check: unknown model {name!r} (default, {', '.join(RANDOM_CONFIGS)})")
    print("device check: ok")


if __name__ == "__main__":
    main()
