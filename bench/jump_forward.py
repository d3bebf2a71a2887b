"""Jump-forward benchmark: grammar-constrained requests with jump-forward on and off, side by side in one run
on one engine, with the latency ratio and the device steps per request.

Two request sets, greedy (temperature 0), one request at a time (`--max-batch 1` engine, so each latency is
one request's own):
- named: `--prompts` user questions, each with 4 tools and a named `tool_choice` (the call's opening markup
  and the function name are forced text);
- json_schema: `--prompts` requests for a strict 10-key `json_schema` reply (compact layout: every key and
  separator is forced text).
Each request runs twice, on and off in turn (alternating which goes first, so drift on a shared host hits
both), on the same in-process service (`jaxchat.api.build_chat_service`, the default model unless
`--model`): the engine's `scheduler.jump_forward` is switched between them, so both use the same compiled
programs. Per request: end-to-end latency (`service.chats.answer`, parse included), completion tokens,
forced tokens (the engine's counter) and device steps (completion tokens - forced: each sampled token is one
prefill, decode or extend step), and the parsed result (tool name and arguments, or the JSON content).
Prints per set the mean latency on and off, off / on (the speed-up), mean steps per request, and the share of
requests whose parsed results are equal on and off; last one line per set:
`json_schema: on 1.20 s, off 2.10 s, speed-up 1.75x, steps 20.0 vs 64.0, equal 100%`.

    python bench/jump_forward.py [--model PATH] [--prompts 10] [--max-context 1024] [--max-tokens 256]

"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CITIES = ["Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Hanoi", "Perth", "Dakar", "Tallinn", "Denver", "Porto"]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": {"type": "object", "properties": {
                                          "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                                          "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "search_flights", "description": "Flights between two cities",
                                      "parameters": {"type": "object", "properties": {
                                          "origin": {"type": "string"}, "destination": {"type": "string"},
                                          "date": {"type": "string"}}, "required": ["origin", "destination"]}}},
    {"type": "function", "function": {"name": "local_time", "description": "The local time in a city",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "convert_currency", "description": "Convert an amount",
                                      "parameters": {"type": "object", "properties": {
                                          "amount": {"type": "number"}, "from": {"type": "string"},
                                          "to": {"type": "string"}}, "required": ["amount", "from", "to"]}}},
]
NAMED = ["get_weather", "search_flights", "local_time", "convert_currency"]
CITY_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"}, "country": {"type": "string"}, "continent": {"type": "string"},
        "population_millions": {"type": "number"}, "is_capital": {"type": "boolean"},
        "language": {"type": "string"}, "currency": {"type": "string"}, "timezone": {"type": "string"},
        "famous_dish": {"type": "string"}, "founded_year": {"type": "integer"},
    },
    "required": ["city", "country", "continent", "population_millions", "is_capital", "language", "currency",
                 "timezone", "famous_dish", "founded_year"],
    "additionalProperties": False,
}


def request_sets(n: int) -> dict[str, list[dict]]:
    named = []
    for i in range(n):
        city, other = CITIES[i % len(CITIES)], CITIES[(i + 3) % len(CITIES)]
        name = NAMED[i % len(NAMED)]
        question = {"get_weather": f"What's the weather in {city}?",
                    "search_flights": f"Find me a flight from {city} to {other} next Friday.",
                    "local_time": f"What time is it in {city} right now?",
                    "convert_currency": f"How much is {100 + 25 * i} euros in the currency of {city}?"}[name]
        named.append({"messages": [{"role": "user", "content": question}], "tools": TOOLS,
                      "tool_choice": {"type": "function", "function": {"name": name}}})
    schema = [{"messages": [{"role": "user", "content": f"Give me the facts about {CITIES[i % len(CITIES)]} as JSON."}],
               "response_format": {"type": "json_schema",
                                   "json_schema": {"name": "city_facts", "schema": CITY_SCHEMA, "strict": True}}}
              for i in range(n)]
    return {"named": named, "json_schema": schema}


def parsed(reply: dict):
    msg = reply["choices"][0]["message"]
    if msg.get("tool_calls"):
        return [(c["function"]["name"], c["function"]["arguments"]) for c in msg["tool_calls"]]
    return msg.get("content")


async def one(service, body: dict, jump: bool, max_tokens: int) -> dict:
    from jaxchat.api.request import parse_chat_request

    sched = service.engine.scheduler
    sched.jump_forward = jump
    forced = sched.forced_tokens
    t0 = time.perf_counter()
    reply = await service.chats.answer(parse_chat_request({"model": "m", "temperature": 0,
                                                              "max_tokens": max_tokens, **body}))
    seconds = time.perf_counter() - t0
    tokens = reply["usage"]["completion_tokens"]
    forced = sched.forced_tokens - forced
    return {"seconds": seconds, "tokens": tokens, "forced": forced, "steps": tokens - forced,
            "parsed": parsed(reply), "finish": reply["choices"][0]["finish_reason"]}


async def run_set(service, bodies: list[dict], max_tokens: int) -> dict:
    await one(service, bodies[0], True, max_tokens)  # unmeasured: compiles this set's grammar
    samples = {True: [], False: []}
    for i, body in enumerate(bodies):
        for jump in ((True, False) if i % 2 == 0 else (False, True)):
            samples[jump].append(await one(service, body, jump, max_tokens))
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: the default model asset")
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--max-context", type=int, default=1024)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--json", default=None, help="write every sample here")
    args = ap.parse_args()

    from jaxchat.api import build_chat_service
    from jaxchat.engine.compile_cache import enable_compile_cache

    cache = enable_compile_cache()
    service = build_chat_service(args.model, max_batch=1, max_context=args.max_context, programs="all",
                                 speculative="off", executable_cache=cache / "executables")
    results, lines = {}, []
    try:
        for name, bodies in request_sets(args.prompts).items():
            samples = asyncio.run(run_set(service, bodies, args.max_tokens))
            results[name] = samples
            on, off = samples[True], samples[False]
            mean = lambda rows, key: statistics.fmean(r[key] for r in rows)  # noqa: E731
            equal = sum(a["parsed"] == b["parsed"] for a, b in zip(on, off, strict=True)) / len(on)
            t_on, t_off = mean(on, "seconds"), mean(off, "seconds")
            print(f"{name}: {len(on)} requests")
            print(f"  latency   on {t_on:6.2f} s   off {t_off:6.2f} s   speed-up off/on {t_off / t_on:.2f}x")
            print(f"  steps     on {mean(on, 'steps'):6.1f}     off {mean(off, 'steps'):6.1f}   "
                  f"(tokens {mean(on, 'tokens'):.1f} / {mean(off, 'tokens'):.1f}, forced {mean(on, 'forced'):.1f})")
            print(f"  finish    on {[r['finish'] for r in on]}")
            print(f"  parsed results equal on/off: {equal:.0%}")
            lines.append(f"{name}: on {t_on:.2f} s, off {t_off:.2f} s, speed-up {t_off / t_on:.2f}x, "
                         f"steps {mean(on, 'steps'):.1f} vs {mean(off, 'steps'):.1f}, equal {equal:.0%}")
    finally:
        service.close()
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "samples": {
            k: {("on" if j else "off"): v for j, v in s.items()} for k, s in results.items()}}, indent=1, default=str))


if __name__ == "__main__":
    main()
