"""Mixed steps on vs off (or any `jaxchat serve` flag sets), against the engine's own batched decode rate, in one run.

1. The engine's steady-state decode aggregate at batch 16 (`bench/decode.py`'s `run_jaxchat`: the tokens all
   rows generate while every one of them decodes, prefills excluded), in this process, on the served prompt.
2. `jaxchat serve` twice, both started first (an idle server takes no CPU): `--prefill-chunk 64` (mixed
   steps, the default on TPU/GPU) and `--prefill-chunk 0` (every prompt in a prefill program of its own), then
   driven in turns, `--rounds` times each (so a slower spell of this shared host hits both alike), by `bench/serve.py`'s
   closed loop (the async `openai` SDK, streaming, greedy, `--max-tokens` output tokens, eos ignored) at
   concurrency 1 and 16, unconstrained; each figure is the median over its rounds.

Also times, on the engine's runner, what a closed loop's next wave costs when the cache holds each prompt but
its last token (prefix reuse): that token prefilled once per arrival vs all of them in one batched prefill
(`StepRunner.prefill_rows`), and the row swap that places each arrival.

Prints, per server: output tokens/s at concurrency 16 over the decode aggregate (the issue's bar: >= 0.85),
TTFT p50 at concurrency 16 over concurrency 1 (bar: <= 3), and mixed / separate for both; and the ceiling
arithmetic: a prompt's tokens cost compute too, so output tokens/s cannot pass decode aggregate x
out / (out + prompt x prompt token cost / decode token cost), with the two costs measured here (a 64-token
chunk beside 16 decode rows vs a decode step alone). Writes `mixed_steps.json` into `--out`.

    python bench/mixed_steps.py [--max-tokens 64] [--chunks 64,0 | --servers 'FLAGS;FLAGS'] [--rounds 2]
                                [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.decode import run_jaxchat  # noqa: E402
from bench.serve import MESSAGES, drive, free_port, start_server, stop_server, wait_healthy  # noqa: E402


def engine_rates(args) -> dict:
    """Decode aggregate at batch 16, and the step times of decode alone vs decode + a full prompt chunk."""
    import jax

    from jaxchat.assets import DEFAULT_MODEL, asset_path
    from jaxchat.engine.compile_cache import enable_compile_cache
    from jaxchat.engine.engine import Engine
    from jaxchat.engine.sampler import SamplingArrays
    from jaxchat.models import load_model

    model = load_model(str(asset_path(DEFAULT_MODEL)), "float32")
    text = model.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    prompt = model.tokenizer.encode(text, add_special_tokens=False)
    cache = enable_compile_cache(None)  # the servers' own cache: the same programs are compiled once
    engine = Engine(model, max_batch=args.max_batch, max_context=args.max_context, prefill_chunk=64,
                    executable_cache=cache / "executables")
    try:
        run_jaxchat(engine, prompt, 8, 1)
        decode = float(np.median([run_jaxchat(engine, prompt, args.max_tokens, args.max_batch)[1]
                                  for _ in range(args.repeats)]))
        engine.shutdown()  # the loop thread stops; the runner is driven directly below
        r, b = engine.runner, args.max_batch
        tokens, positions = np.zeros(b, np.int32), np.full(b, len(prompt), np.int32)
        positions[-1] = -1  # the chunk's row
        sp, mask = SamplingArrays.numpy(b), np.full((b, r.mask_words), -1, np.int32)
        sp1, mask1 = SamplingArrays.numpy(b + 1), np.full((b + 1, r.mask_words), -1, np.int32)
        chunk = (prompt * 4)[: r.prefill_chunk]

        def timed(fn, n=5):
            fn()
            ts = []
            for _ in range(n):
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
            return float(np.median(ts))

        t_decode = timed(lambda: r.decode(tokens, positions, mask, sp))
        t_mixed = timed(lambda: r.mixed(tokens, positions, [(b - 1, chunk, 0, chunk, len(chunk), True)], mask1, sp1))
        t_prefill = timed(lambda: r.prefill(b - 1, prompt, mask[:1], SamplingArrays.numpy(1)))
        # a wave of arrivals whose prompts the cache holds but the last token: one each, or all in one program
        n = len(prompt)
        t_one_token = timed(lambda: r.prefill(b - 1, prompt, mask[:1], SamplingArrays.numpy(1), start=n - 1))
        t_rows = timed(lambda: r.prefill_rows(0, [(prompt, n - 1, n)] * b, mask, sp)) if r.prefill_batches else None
        t_swap = timed(lambda: jax.block_until_ready(r.swap(0, b - 1) or r.state)) if r.keep_prefixes else None
    finally:
        engine.shutdown()
    return {"prompt_tokens": len(prompt), "decode_aggregate": decode, "step_decode_s": t_decode,
            "step_mixed_s": t_mixed, "prefill_s": t_prefill, "chunk": r.prefill_chunk,
            "prefill_last_token_s": t_one_token, "prefill_rows_last_token_s": t_rows, "swap_s": t_swap}


def start(args, flags: str, out: Path):
    port = free_port()
    log = out / f"mixed_steps_serve_{flags.replace(' ', '').replace('-', '_')}.log"
    proc = start_server(args, port, log, tuple(flags.split()))
    try:
        ready = wait_healthy(proc, port, log, args.startup_timeout)
    except BaseException:
        stop_server(proc)
        raise
    print(f"jaxchat serve {flags}: ready in {ready:.0f} s", flush=True)
    return proc, f"http://127.0.0.1:{port}/v1"


def serve_levels(args, chunks: list[str], out: Path) -> dict:
    """{server flags: {concurrency: summary with the median of each figure over the rounds}}."""
    servers = {}
    try:
        for c in chunks:
            servers[c] = start(args, c, out)
        runs = {c: [] for c in chunks}
        for _ in range(args.rounds):
            for c in chunks:
                _, levels = asyncio.run(drive(args, servers[c][1], ("unconstrained",)))
                runs[c].append({lv.concurrency: lv.summary() for lv in levels})
    finally:
        for proc, _ in servers.values():
            stop_server(proc)
    return {c: {conc: {k: float(np.median([r[conc][k] for r in rs])) if isinstance(rs[0][conc][k], float)
                       else rs[0][conc][k] for k in rs[0][conc]} for conc in rs[0]} for c, rs in runs.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-tokens", type=int, default=64, help="output tokens per request (eos ignored)")
    p.add_argument("--chunks", default="64,0", help="--prefill-chunk of each server (0: separate prefills)")
    p.add_argument("--servers", default=None,
                   help="instead of --chunks: each server's `jaxchat serve` flags, separated by ';' (e.g. "
                        "'--prefill-chunk 0;--prefill-chunk 0 --no-batched-prefill')")
    p.add_argument("--repeats", type=int, default=2, help="decode-aggregate runs (median)")
    p.add_argument("--rounds", type=int, default=2, help="turns each server is driven (medians)")
    p.add_argument("--max-context", type=int, default=512)
    p.add_argument("--startup-timeout", type=float, default=1800)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = p.parse_args(argv)
    args.concurrency, args.max_batch, args.requests_per_level, args.model = [1, 16], 16, None, None
    args.constraint = "json"  # unused: the servers run unconstrained only
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    eng = engine_rates(args)
    print(f"engine: prompt {eng['prompt_tokens']} tokens; decode aggregate at batch 16 "
          f"{eng['decode_aggregate']:.1f} tok/s; step: decode {eng['step_decode_s'] * 1e3:.0f} ms, decode + "
          f"{eng['chunk']}-token chunk {eng['step_mixed_s'] * 1e3:.0f} ms, prefill alone {eng['prefill_s'] * 1e3:.0f} ms",
          flush=True)
    if eng["prefill_rows_last_token_s"] is not None and eng["swap_s"] is not None:
        print(f"a wave of {args.max_batch} prompts held but their last token: {args.max_batch} prefills "
              f"{args.max_batch * eng['prefill_last_token_s'] * 1e3:.0f} ms, one batched prefill "
              f"{eng['prefill_rows_last_token_s'] * 1e3:.0f} ms; a row swap {eng['swap_s'] * 1e3:.1f} ms", flush=True)
    variants = ([v.strip() for v in args.servers.split(";")] if args.servers
                else [f"--prefill-chunk {int(c)}" for c in args.chunks.split(",")])
    servers = serve_levels(args, variants, out)
    # per prompt token, in decode-token units: the chunk's extra step time over its tokens, over a decode
    # token's share of a full decode step
    cost = ((eng["step_mixed_s"] - eng["step_decode_s"]) / eng["chunk"]) / (eng["step_decode_s"] / args.max_batch)
    ceiling = args.max_tokens / (args.max_tokens + eng["prompt_tokens"] * cost)
    print(f"\nprompt token cost = {cost:.2f} decode tokens -> ceiling of serve / decode at "
          f"{args.max_tokens} output tokens per request: {ceiling:.2f}\n")
    width = max(len(v) for v in variants) + 2
    print(f"{'server':<{width}}{'c16 tok/s':>10}{'/ decode':>10}{'TTFT c1':>9}{'TTFT c16':>10}{'c16 / c1':>10}")
    rows = {}
    for c, lv in servers.items():
        r = {"tokens_per_s": lv[16]["output_tokens_per_s"], "ttft_c1": lv[1]["ttft_p50_s"],
             "ttft_c16": lv[16]["ttft_p50_s"]}
        r["serve_over_decode"] = r["tokens_per_s"] / eng["decode_aggregate"]
        r["ttft_ratio"] = r["ttft_c16"] / r["ttft_c1"]
        rows[c] = r
        print(f"{c:<{width}}{r['tokens_per_s']:>10.1f}{r['serve_over_decode']:>10.2f}{r['ttft_c1']:>8.2f}s"
              f"{r['ttft_c16']:>9.2f}s{r['ttft_ratio']:>10.2f}")
    chunks = list(rows)
    if len(chunks) == 2:
        a, b = rows[chunks[0]], rows[chunks[1]]
        print(f"\n[{chunks[0]}] / [{chunks[1]}]: c16 tok/s {a['tokens_per_s'] / b['tokens_per_s']:.2f}x, "
              f"TTFT p50 c16 {a['ttft_c16'] / b['ttft_c16']:.2f}x")
    print(f"bars: serve / decode >= 0.85 (ceiling here {ceiling:.2f}); TTFT c16 / c1 <= 3")
    print(f"total {time.perf_counter() - t0:.0f} s")
    (out / "mixed_steps.json").write_text(json.dumps(
        {"benchmark": "mixed_steps", "command": " ".join(["bench/mixed_steps.py", *(argv or sys.argv[1:])]),
         "engine": eng, "prompt_token_cost": cost, "ceiling": ceiling, "servers": rows,
         "levels": {str(c): lv for c, lv in servers.items()}}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
