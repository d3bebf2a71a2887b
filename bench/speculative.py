"""Speculative decoding benchmark: prompt-lookup drafts on and off, side by side in one run on one engine, with
the wall-time ratio, tokens per step and the draft acceptance rate.

Two workloads, greedy (temperature 0), eos honoured, `--max-tokens` new tokens at most:
- copy: requests whose answer copies the conversation: edit a given Python file (rename one function and
  return the whole file), repeat a JSON record with one field changed, and a tool call (`tool_choice`
  required) whose arguments quote a note from the user message;
- free: open-ended writing (a story, an explanation) with nothing to copy.
Each workload runs at batch 1 (one request at a time) and at batch 16 (16 requests at once), with speculation
on and off in turn (alternating which goes first, so drift on a shared host hits both), on one in-process
service built with `speculative="ngram"`: the scheduler's speculator is switched off by setting its draft
length to 0, so both sides use the same compiled programs (the off side never runs a verify program).
Per cell: wall time, completion tokens, forward steps (the engine's launches), drafted and accepted tokens,
and whether the replies on and off are identical (they must be: greedy speculation is exact).
Prints one table row per workload and batch size: tokens/s on and off, on/off speed-up, tokens per step on
and off, acceptance (accepted / drafted), equal replies; then one line per cell:
`copy b1: speed-up 1.62x, tokens/step 2.31 vs 1.00, acceptance 71%, equal 3/3`.

    python bench/speculative.py [--model PATH] [--prompts 3] [--batches 1,16] [--max-tokens 192]

"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CODE = '''import json
from pathlib import Path


def load_records(path):
    """Read one JSON record per line."""
    records = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            records.append(json.loads(line))
    return records


def total_amount(records):
    return sum(float(r["amount"]) for r in records if r.get("status") == "paid")


def by_customer(records):
    groups = {}
    for r in records:
        groups.setdefault(r["customer"], []).append(r)
    return groups


if __name__ == "__main__":
    rows = load_records("orders.jsonl")
    print(total_amount(rows))
    print(len(by_customer(rows)))
'''
RECORD = {"id": 4711, "customer": "Ada Lovelace", "email": "ada@example.org", "city": "London",
          "items": ["notebook", "pencil", "compass"], "amount": 42.5, "currency": "GBP", "status": "paid",
          "note": "deliver to the side entrance before noon"}
NOTES = ["Meeting with the design team moved to Thursday 3pm in room 4B; bring the printed mock-ups and the "
         "budget sheet from last quarter.",
         "Pick up the dry cleaning from Rue Cler 12 before 6pm, then call Marie about the dinner reservation "
         "for eight people on Saturday.",
         "Server migration: copy /var/lib/postgres to the new host db-02, verify checksums, then switch the DNS "
         "record for api.example.com."]
SAVE_NOTE = {"type": "function", "function": {
    "name": "save_note", "description": "Save a note exactly as the user wrote it",
    "parameters": {"type": "object", "properties": {"title": {"type": "string"}, "text": {"type": "string"}},
                   "required": ["title", "text"]}}}
FREE = ["Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Explain how a refrigerator works to a ten-year-old.",
        "Describe a day in the life of a medieval blacksmith.",
        "Write a poem about autumn rain in a big city.",
        "What are the main causes of inflation? Explain in plain words."]


def copy_requests(n: int) -> list[dict]:
    kinds = []
    for i in range(n):
        kind = i % 3
        if kind == 0:
            old, new = [("total_amount", "paid_total"), ("by_customer", "group_by_customer"),
                        ("load_records", "read_jsonl")][(i // 3) % 3]
            kinds.append({"messages": [{"role": "user", "content":
                f"Here is a Python file:\n\n```python\n{CODE}```\n\nRename the function `{old}` to `{new}` "
                "everywhere and return the whole file, nothing else."}]})
        elif kind == 1:
            city = ["Paris", "Berlin", "Madrid"][(i // 3) % 3]
            kinds.append({"messages": [{"role": "user", "content":
                f"Here is a JSON record:\n{json.dumps(RECORD, indent=2)}\n\nRepeat the record exactly, with the "
                f"city changed to {city}. Reply with the JSON only."}]})
        else:
            note = NOTES[(i // 3) % len(NOTES)]
            kinds.append({"messages": [{"role": "user", "content":
                f"Save this note with the title 'todo {i}', word for word: {note}"}],
                "tools": [SAVE_NOTE], "tool_choice": "required"})
    return kinds


def free_requests(n: int) -> list[dict]:
    return [{"messages": [{"role": "user", "content": FREE[i % len(FREE)]}]} for i in range(n)]


def reply_of(reply: dict):
    msg = reply["choices"][0]["message"]
    if msg.get("tool_calls"):
        return [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]]
    return msg.get("content")


class Counter:
    """Counts the engine's forward launches (one per step)."""

    def __init__(self, runner) -> None:
        self.launches = 0
        launch = runner.launch

        def counted(rows):
            self.launches += 1
            return launch(rows)

        runner.launch = counted


async def run_cell(service, counter: Counter, bodies: list[dict], on: bool, k: int, max_tokens: int) -> dict:
    from jaxchat.api.request import parse_chat_request

    spec = service.engine.scheduler.speculator
    spec.k_max = k if on else 0
    drafted, accepted, launches = spec.drafted, spec.accepted, counter.launches
    t0 = time.perf_counter()
    replies = await asyncio.gather(*(service.chats.answer(parse_chat_request(
        {"model": "m", "temperature": 0, "max_tokens": max_tokens, **body})) for body in bodies))
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "tokens": sum(r["usage"]["completion_tokens"] for r in replies),
            "steps": counter.launches - launches, "drafted": spec.drafted - drafted,
            "accepted": spec.accepted - accepted, "replies": [reply_of(r) for r in replies]}


async def run_workload(service, counter: Counter, bodies: list[dict], batch: int, k: int, max_tokens: int) -> dict:
    groups = [bodies[i:i + batch] for i in range(0, len(bodies), batch)]
    await run_cell(service, counter, groups[0][:1], True, k, 8)  # unmeasured: compiles this workload's grammars
    cells = {True: [], False: []}
    for i, group in enumerate(groups):
        for on in ((True, False) if i % 2 == 0 else (False, True)):
            cells[on].append(await run_cell(service, counter, group, on, k, max_tokens))
    return cells


def summarise(cells: dict) -> dict:
    total = {on: {key: sum(c[key] for c in cells[on]) for key in ("seconds", "tokens", "steps", "drafted",
                                                                     "accepted")} for on in cells}
    replies = {on: [r for c in cells[on] for r in c["replies"]] for on in cells}
    on, off = total[True], total[False]
    return {"tok_s_on": on["tokens"] / on["seconds"], "tok_s_off": off["tokens"] / off["seconds"],
            "speedup": off["seconds"] / on["seconds"] * on["tokens"] / max(1, off["tokens"]),
            "per_step_on": on["tokens"] / max(1, on["steps"]), "per_step_off": off["tokens"] / max(1, off["steps"]),
            "acceptance": on["accepted"] / on["drafted"] if on["drafted"] else 0.0,
            "equal": sum(a == b for a, b in zip(replies[True], replies[False], strict=True)),
            "requests": len(replies[True])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: the default model asset")
    ap.add_argument("--prompts", type=int, default=3, help="requests per workload at batch 1 (batch b runs b)")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--workloads", default="copy,free")
    ap.add_argument("--max-tokens", type=int, default=192)
    ap.add_argument("--max-context", type=int, default=2048)
    ap.add_argument("--draft-tokens", type=int, default=None, help="k_max per row (default: the engine's)")
    ap.add_argument("--json", default=None, help="write every cell here")
    args = ap.parse_args()

    from jaxchat.api import build_chat_service
    from jaxchat.engine.compile_cache import enable_compile_cache
    from jaxchat.engine.config import DRAFT_TOKENS

    batches = [int(b) for b in args.batches.split(",")]
    cache = enable_compile_cache()
    k = args.draft_tokens or DRAFT_TOKENS
    service = build_chat_service(args.model, max_batch=max(batches), max_context=args.max_context,
                                 speculative="ngram", draft_tokens=k, executable_cache=cache / "executables")
    counter = Counter(service.engine.core.runner)
    makers = {"copy": copy_requests, "free": free_requests}
    results, lines = {}, []
    try:
        print(f"{'workload':10} {'batch':>5} {'tok/s on':>9} {'tok/s off':>9} {'speed-up':>8} "
              f"{'tok/step on':>11} {'off':>5} {'accept':>7} {'equal':>7}")
        for name in args.workloads.split(","):
            for batch in batches:
                bodies = makers[name](args.prompts if batch == 1 else batch)
                cells = asyncio.run(run_workload(service, counter, bodies, batch, k, args.max_tokens))
                s = summarise(cells)
                results[f"{name} b{batch}"] = {"summary": s, "cells": {("on" if o else "off"): c
                                                                       for o, c in cells.items()}}
                print(f"{name:10} {batch:5d} {s['tok_s_on']:9.2f} {s['tok_s_off']:9.2f} {s['speedup']:7.2f}x "
                      f"{s['per_step_on']:11.2f} {s['per_step_off']:5.2f} {s['acceptance']:7.0%} "
                      f"{s['equal']:3d}/{s['requests']:<3d}", flush=True)
                lines.append(f"{name} b{batch}: speed-up {s['speedup']:.2f}x, tokens/step {s['per_step_on']:.2f} vs "
                             f"{s['per_step_off']:.2f}, acceptance {s['acceptance']:.0%}, "
                             f"equal {s['equal']}/{s['requests']}")
    finally:
        service.close()
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1, default=str))


if __name__ == "__main__":
    main()
