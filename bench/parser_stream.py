"""Streaming parser cost: jaxchat's resumable `ChatStream` against a full re-parse per token.

Streams a 32,000-character reply (reasoning, long content, tool calls) token by token through
`ChatStream`, and through the naive approach of the reference (parse the whole turn again on every
token and diff), side by side in one run. Prints the total time of both, the speedup, and the
per-token cost in the first and last 10% of the reply. Exits non-zero when jaxchat's per-token cost
at the end is more than 2x its cost at the start (quadratic growth) or when both disagree.

    .venv/bin/python bench/parser_stream.py [--chars 32000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time

from jaxchat.chat import (
    ChatMsg,
    ChatParseOptions,
    ChatStream,
    apply_deltas,
    chat_compute_deltas,
    chat_format_make,
    chat_parse,
)

SPEC = chat_format_make("hermes_json", reasoning=True)
TOOLS = [{"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {}}}}]
OPTIONS = ChatParseOptions(tools=TOOLS)
PARAGRAPH = (
    "The scheduler admits a request into a free slot, prefills its prompt in a bucketed length, and then "
    "decodes one token per step together with every other running request. Überprüfung läuft 🚀. "
)


def build_reply(chars: int) -> str:
    """A reply of exactly `chars` characters: a short reasoning block, then the same unit (two
    paragraphs of content and one tool call) over and over, so that the first and the last 10% hold
    the same kind of text and any difference in per-token cost is growth with the reply's length."""
    parts = ["<think>\n" + PARAGRAPH * 3 + "\n</think>\n\n"]
    i = 0
    while sum(map(len, parts)) < chars - 1000:
        call = {"name": "write_file", "arguments": {"path": f"notes/{i}.md", "text": PARAGRAPH, "lines": i}}
        parts.append(PARAGRAPH * 2 + "\n<tool_call>\n" + json.dumps(call, ensure_ascii=False) + "\n</tool_call>\n")
        i += 1
    reply = "".join(parts)
    return reply + (PARAGRAPH * 10)[: chars - len(reply)]


def tokenize(text: str) -> list[str]:
    """Split like a BPE tokenizer would, roughly: the real Qwen2.5 tokenizer when it is fetched."""
    try:
        from transformers import AutoTokenizer

        from jaxchat.assets import DEFAULT_MODEL, asset_path

        path = asset_path(DEFAULT_MODEL)
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        offsets = tok(text, return_offsets_mapping=True, add_special_tokens=False)["offset_mapping"]
        bounds = sorted({0, len(text), *(b for _, b in offsets)})
        return [text[a:b] for a, b in zip(bounds, bounds[1:])]
    except Exception as exc:  # the bench still runs without the model's tokenizer
        print(f"(tokenizer unavailable: {exc}; splitting on word boundaries)", file=sys.stderr)
        return re.findall(r"\s*[^\s<>]+|\s+|[<>]", text)


def run_stream(tokens: list[str]) -> tuple[list[int], ChatMsg]:
    stream = ChatStream(SPEC, OPTIONS)
    received = ChatMsg()
    costs = []
    for token in tokens:
        t0 = time.perf_counter_ns()
        deltas = stream.update(token, False)
        costs.append(time.perf_counter_ns() - t0)
        received = apply_deltas(received, deltas)
    return costs, apply_deltas(received, stream.update("", True))


def run_naive(tokens: list[str]) -> tuple[list[int], ChatMsg]:
    text, prev, costs = "", ChatMsg(), []
    received = ChatMsg()
    for token in tokens:
        t0 = time.perf_counter_ns()
        text += token
        cur = chat_parse(SPEC, text, True, OPTIONS)
        deltas = chat_compute_deltas(prev, cur)
        prev = cur
        costs.append(time.perf_counter_ns() - t0)
        received = apply_deltas(received, deltas)
    return costs, apply_deltas(received, chat_compute_deltas(prev, chat_parse(SPEC, text, False, OPTIONS)))


def window_us(costs: list[int], first: bool) -> float:
    n = max(1, len(costs) // 10)
    part = costs[:n] if first else costs[-n:]
    return statistics.fmean(part) / 1000


def best_of(runner, tokens, repeats):
    runs = [runner(tokens) for _ in range(repeats)]
    costs = [min(col) for col in zip(*(c for c, _ in runs))]
    return costs, runs[0][1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chars", type=int, default=32_000)
    parser.add_argument("--repeats", type=int, default=3, help="per-token cost is the minimum over repeats")
    args = parser.parse_args()
    reply = build_reply(args.chars)
    tokens = tokenize(reply)
    ours, ours_msg = best_of(run_stream, tokens, args.repeats)
    naive, naive_msg = best_of(run_naive, tokens, args.repeats)
    same = (ours_msg.content, ours_msg.reasoning_content, [(c.name, c.arguments) for c in ours_msg.tool_calls]) == (
        naive_msg.content, naive_msg.reasoning_content, [(c.name, c.arguments) for c in naive_msg.tool_calls])
    total_ours, total_naive = sum(ours) / 1e6, sum(naive) / 1e6
    start, end = window_us(ours, True), window_us(ours, False)
    print(f"reply: {len(reply)} chars, {len(tokens)} tokens, {len(ours_msg.tool_calls)} tool calls")
    print(f"{'':28}{'jaxchat ChatStream':>20}{'naive re-parse':>18}")
    print(f"{'total (ms)':28}{total_ours:>20.1f}{total_naive:>18.1f}")
    print(f"{'per token, first 10% (us)':28}{start:>20.2f}{window_us(naive, True):>18.2f}")
    print(f"{'per token, last 10% (us)':28}{end:>20.2f}{window_us(naive, False):>18.2f}")
    print(f"speedup (naive / jaxchat): {total_naive / total_ours:.1f}x")
    print(f"jaxchat growth (last 10% / first 10%): {end / start:.2f}x (bar: <= 2x)")
    print(f"same final message: {same}")
    return 0 if same and end <= 2 * start else 1


if __name__ == "__main__":
    sys.exit(main())
