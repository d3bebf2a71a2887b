"""Soak: many sequential and concurrent requests against a live server; memory and compiles stay flat.

    python bench/soak.py                      # 500 requests, tiny random Qwen2 + the real Qwen2.5 tokenizer
    python bench/soak.py --model PATH --requests 2000 --concurrency 32

The request mix: streamed and plain chat, tool calls (tool_choice required), json_schema, text completions,
and clients that disconnect mid-stream. Requests run in blocks: a sequential block of 10, then a burst of
`--concurrency` at once, repeated. After the first `--warmup` requests the script records the process's
resident memory (VmRSS), the engine's compile count and the grammar cache size; at the end it checks that
resident memory grew less than `--max-growth` (10%), that no compile happened, that every request ended
(completed, or disconnected on purpose), that nothing is running and every slot is free. It prints one
line of counts and exits 1 when a check fails. `tests/reliability/test_soak.py` runs a reduced version
(120 requests) in CI with the same function.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.reliability.support import (  # noqa: E402
    SCHEMA,
    TIME,
    WEATHER,
    StreamResult,
    json_schema_format,
    leaked_slots,
    parse_sse_line,
    rss_bytes,
    user,
    wait_idle,
)


def soak_request(i: int) -> tuple[str, dict, str]:
    """(path, body, kind) of request number i; the mix repeats every 10 requests."""
    k = i % 10
    g = {"temperature": 0, "frequency_penalty": 1.0}
    if k in (0, 5):
        return "/v1/chat/completions", {"messages": user(f"Soak {i}: tell me something"), "max_tokens": 8,
                                        "stream": True, **g}, "chat_stream"
    if k == 1:
        return "/v1/chat/completions", {"messages": user(f"Soak {i}"), "max_tokens": 8, "temperature": 0.8,
                                        "seed": i}, "chat"
    if k == 2:
        return "/v1/chat/completions", {"messages": user(f"Weather {i}?"), "tools": [WEATHER, TIME],
                                        "tool_choice": "required", "max_tokens": 64, "stream": True,
                                        "temperature": 0}, "tools"
    if k == 3:
        return "/v1/chat/completions", {"messages": user(f"Verdict {i}"), "response_format": json_schema_format(
            "verdict", SCHEMA), "max_tokens": 48, "temperature": 0}, "json_schema"
    if k == 4:
        return "/v1/completions", {"prompt": f"Soak {i} once upon a time", "max_tokens": 8, **g}, "completion"
    if k == 6:
        return "/v1/completions", {"prompt": f"Soak {i}", "max_tokens": 8, "stream": True, **g}, "completion_stream"
    if k == 7:
        return "/v1/chat/completions", {"messages": user(f"Leave {i}"), "max_tokens": 200, "ignore_eos": True,
                                        "stream": True, **g}, "disconnect"
    if k == 8:
        return "/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief."},
                                                     *user(f"Soak {i}")], "max_tokens": 8, "think": False,
                                        **g}, "chat"
    return "/v1/chat/completions", {"messages": user(f"Soak {i}"), "max_tokens": 6, "n": 2, **g}, "chat_n2"


async def one(http: httpx.AsyncClient, base: str, i: int, counts: Counter) -> None:
    path, body, kind = soak_request(i)
    counts["sent"] += 1
    if body.get("stream"):
        async with http.stream("POST", base + path, json=body, timeout=300) as r:
            counts[f"{r.status_code // 100}xx"] += 1
            if r.status_code != 200:
                await r.aread()
                return
            res, lines = StreamResult(200), 0
            async for line in r.aiter_lines():
                if line.startswith("data: {") and path == "/v1/completions":
                    chunk = json.loads(line[6:])
                    res.error = chunk.get("error")
                    if chunk.get("choices") and chunk["choices"][0].get("finish_reason"):
                        res.finish_reason = chunk["choices"][0]["finish_reason"]
                    res.done = False
                elif line == "data: [DONE]":
                    res.done = True
                else:
                    parse_sse_line(line, res)
                lines += line.startswith("data: ")
                if kind == "disconnect" and lines >= 3:
                    counts["disconnected"] += 1
                    return
            if res.done and res.finish_reason and res.error is None:
                counts["completed"] += 1
    else:
        r = await http.post(base + path, json=body, timeout=300)
        counts[f"{r.status_code // 100}xx"] += 1
        if r.status_code == 200 and all(c.get("finish_reason") for c in r.json()["choices"]):
            counts["completed"] += 1


def _grammar_cache_size(service) -> int:
    grammar = getattr(service, "grammar", None)
    return len(getattr(grammar, "_cache", {}) or {})


async def run_soak(base: str, service, total: int = 500, warmup: int = 50, concurrency: int = 16,
                   sequential_block: int = 10, log=print) -> dict:
    """Drive `total` requests at the server at `base`; returns the measurements (see the module doc)."""
    engine = service.engine
    counts: Counter = Counter()
    marks: dict[str, object] = {}
    started = time.monotonic()

    def mark_after_warmup() -> None:
        wait_idle(engine, timeout=30)
        gc.collect()
        marks.update(rss0=rss_bytes(), compiles0=engine.stats().compile_count,
                     cache0=_grammar_cache_size(service), t0=time.monotonic())

    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
    async with httpx.AsyncClient(limits=limits) as http:
        i = 0
        while i < total:
            block = min(sequential_block, total - i)
            for _ in range(block):
                await one(http, base, i, counts)
                i += 1
                if i == warmup:
                    mark_after_warmup()
            burst = min(concurrency, total - i)
            if burst:
                await asyncio.gather(*(one(http, base, j, counts) for j in range(i, i + burst)))
                crossed = i < warmup <= i + burst
                i += burst
                if crossed:
                    mark_after_warmup()
            if i and i % 100 < sequential_block + concurrency and log:
                log(f"  {i} requests, rss={rss_bytes() / 2**20:.0f} MiB, {dict(counts)}")
    if "rss0" not in marks:
        mark_after_warmup()
    stats = wait_idle(engine, timeout=30)
    gc.collect()
    rss1 = rss_bytes()
    growth = (rss1 - marks["rss0"]) / marks["rss0"]
    return {
        "counts": counts,
        "rss_after_warmup_mib": marks["rss0"] / 2**20,
        "rss_end_mib": rss1 / 2**20,
        "growth": growth,
        "compiles_after_warmup": stats.compile_count - marks["compiles0"],
        "grammar_cache": (marks["cache0"], _grammar_cache_size(service)),
        "leaked_slots": leaked_slots(stats),
        "running": stats.running,
        "waiting": stats.waiting,
        "seconds": time.monotonic() - started,
    }


def summary(name: str, result: dict) -> str:
    c = result["counts"]
    return (f"[{name}] sent={c['sent']} 4xx={c['4xx']} 5xx={c['5xx']} completed={c['completed']} "
            f"disconnected={c['disconnected']} leaked_slots={result['leaked_slots']} "
            f"rss_after_warmup={result['rss_after_warmup_mib']:.0f}MiB rss_end={result['rss_end_mib']:.0f}MiB "
            f"memory_growth={result['growth'] * 100:+.2f}% compiles_after_warmup={result['compiles_after_warmup']} "
            f"grammar_cache={result['grammar_cache'][0]}->{result['grammar_cache'][1]} "
            f"seconds={result['seconds']:.1f}")


def check(result: dict, max_growth: float = 0.10) -> list[str]:
    c = result["counts"]
    problems = []
    if c["5xx"] or c["4xx"]:
        problems.append(f"{c['4xx']} 4xx and {c['5xx']} 5xx answers")
    if c["completed"] + c["disconnected"] != c["sent"]:
        problems.append(f"only {c['completed'] + c['disconnected']} of {c['sent']} requests ended as planned")
    if result["leaked_slots"] or result["running"] or result["waiting"]:
        problems.append(f"leaked slots {result['leaked_slots']}, running {result['running']}")
    if result["growth"] >= max_growth:
        problems.append(f"resident memory grew {result['growth'] * 100:.1f}% after warmup")
    if result["compiles_after_warmup"]:
        problems.append(f"{result['compiles_after_warmup']} compiles after warmup")
    if result["grammar_cache"][1] != result["grammar_cache"][0]:
        problems.append(f"the grammar cache grew {result['grammar_cache']}")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model path (default: the tiny random Qwen2 test checkpoint)")
    p.add_argument("--requests", type=int, default=500)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-context", type=int, default=1024)
    p.add_argument("--max-growth", type=float, default=0.10)
    args = p.parse_args(argv)

    from jaxchat.api import build_chat_service
    from tests.reliability.tiny import tiny_checkpoint
    from tests.server.conftest import Live

    model = args.model or tiny_checkpoint()
    t0 = time.monotonic()
    service = build_chat_service(model, max_batch=args.max_batch, max_context=args.max_context)
    print(f"service ready in {time.monotonic() - t0:.0f} s: {service.model_id}, {service.spec}")
    try:
        with Live(service) as live:
            result = asyncio.run(run_soak(live.base_url, service, args.requests, args.warmup, args.concurrency))
    finally:
        service.engine.shutdown()
    print(summary("soak", result))
    problems = check(result, args.max_growth)
    for problem in problems:
        print("FAIL:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
