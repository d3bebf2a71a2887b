"""Grammar engine benchmark: compile time (cold, cached) and mask fill per token, jaxchat vs xgrammar.

For 1, 8 and 32 tools (hermes_json, tool_choice auto) and a json_schema response_format, with the
default model's tokenizer: cold compile (a fresh GrammarEngine cache and xgrammar compiler cache),
cached compile (`GrammarEngine.compile` of the same tag again, tag building included), and the
per-token time of `GrammarConstraint.fill_mask` over seeded random walks next to xgrammar's own
`GrammarMatcher.fill_next_token_bitmask` on the same tokens (the floor). Bars: cached compile
< 1 ms, fill p50 < 50 us, p99 < 1 ms.

    .venv/bin/python bench/grammar.py [--walks 20] [--steps 200]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import xgrammar as xgr

from jaxchat.chat import chat_constraint_request_from_openai, chat_format_make
from jaxchat.constrain import GrammarEngine, chat_structural_tag

CACHE = Path.home() / ".cache" / "jaxchat" / "bench-qwen25-tokenizer"


def tokenizer():
    from transformers import AutoTokenizer

    if (CACHE / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(CACHE))
    from jaxchat.assets import asset_path

    p = asset_path("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    tok.save_pretrained(str(CACHE))
    return tok


def tool(i: int) -> dict:
    return {"type": "function", "function": {"name": f"tool_{i}", "parameters": {
        "type": "object", "required": ["q"],
        "properties": {"q": {"type": "string"}, "n": {"type": "integer"}, "mode": {"enum": ["a", "b"]}}}}}


def request(n_tools: int):
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    if n_tools:
        body["tools"] = [tool(i) for i in range(n_tools)]
        body["tool_choice"] = "required"
    else:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": {
            "type": "object", "required": ["a", "b"],
            "properties": {"a": {"type": "string"}, "b": {"type": "integer"}, "c": {"type": "array", "items": {"type": "number"}}}}}}
    return chat_constraint_request_from_openai(body)


def pct(xs, q):
    return float(np.percentile(np.array(xs) * 1e6, q))


def run(engine: GrammarEngine, name: str, req, walks: int, steps: int) -> None:
    spec = chat_format_make("hermes_json")
    tag = chat_structural_tag(spec, req)
    t0 = time.perf_counter()
    engine.compile(tag)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(100):
        engine.compile(chat_structural_tag(spec, req))
    cached = (time.perf_counter() - t0) / 100
    ours, floor = [], []
    n = engine.vocab_size
    row = np.zeros((n + 31) // 32, dtype=np.int32)
    ref = np.zeros((1, (n + 31) // 32), dtype=np.int32)
    for w in range(walks):
        rng = np.random.default_rng(w)
        c = engine.make(spec, req, "")
        m = xgr.GrammarMatcher(engine.compile(tag))
        for _ in range(steps):
            t0 = time.perf_counter()
            c.fill_mask(row)
            t1 = time.perf_counter()
            m.fill_next_token_bitmask(ref)
            t2 = time.perf_counter()
            ours.append(t1 - t0)
            floor.append(t2 - t1)
            allowed = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[:n])
            if not allowed.size or c.is_terminated():
                break
            tok = int(allowed[rng.integers(allowed.size)])
            if not c.accept(tok) or not m.accept_token(tok) or m.is_terminated():
                break
    p50, p99, f50, f99 = pct(ours, 50), pct(ours, 99), pct(floor, 50), pct(floor, 99)
    print(f"{name:12} compile cold {cold * 1e3:8.1f} ms  cached {cached * 1e3:6.3f} ms   "
          f"fill p50 {p50:7.1f} us (xgr {f50:7.1f}, x{p50 / f50:4.2f})  p99 {p99:7.1f} us (xgr {f99:7.1f}, x{p99 / f99:4.2f})"
          f"  n={len(ours)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--walks", type=int, default=20)
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    engine = GrammarEngine(tokenizer(), vocab_size=151936, stop_token_ids=[151645, 151643])
    print(f"engine ready in {engine.ready_ms:.0f} ms")
    for n in (1, 8, 32):
        run(engine, f"{n} tools", request(n), args.walks, args.steps)
    run(engine, "json_schema", request(0), args.walks, args.steps)


if __name__ == "__main__":
    main()
