"""Any-order tool arguments: what the subset-state grammar costs next to the declared-order one.

For one hermes_json tool whose n properties cycle through string, bounded integer, boolean, enum,
array of strings and number (every other one required), with the default model's tokenizer: the
time to build the any-order argument format (`objects.any_order_arguments`, paid once per schema,
then cached), the cold compile of the tool's tag (median of 3, fresh xgrammar compiler without
cache) with the any-order grammar and with xgrammar's declared-order `json_schema` format side by
side, and the size of the tag's JSON (the compiled-grammar cache key, serialised on every request).
Rows at the default bound (`MAX_ANY_ORDER`: exact up to it, groups above) and exact any order past
it, to show what the bound saves.

    .venv/bin/python bench/any_order.py
"""

from __future__ import annotations

import json
import statistics
import time

import xgrammar as xgr
from grammar import tokenizer

from jaxchat.constrain.any_order import MAX_ANY_ORDER
from jaxchat.constrain.objects import any_order_arguments
from jaxchat.constrain.tags import string_excludes

KINDS = [{"type": "string"}, {"type": "integer", "minimum": 0, "maximum": 100}, {"type": "boolean"},
         {"enum": ["a", "b"]}, {"type": "array", "items": {"type": "string"}},
         {"type": "number", "minimum": -1e15, "maximum": 1e15}]
EXCLUDES = string_excludes(["</tool_call>", "<|im_end|>", "<|endoftext|>"])


def arguments(n: int) -> dict:
    schema = {"type": "object", "properties": {f"prop{i}": KINDS[i % len(KINDS)] for i in range(n)},
              "required": [f"prop{i}" for i in range(0, n, 2)]}
    return {"type": "json_schema", "json_schema": schema, "max_whitespace_cnt": 4, "excludes": EXCLUDES}


def compile_ms(info, content: dict) -> tuple[float, int]:
    tag = json.dumps({"type": "structural_tag", "format": {
        "type": "tag", "begin": '<tool_call>\n{"name": "f", "arguments": ', "content": content, "end": "}\n</tool_call>"}})
    times = []
    for _ in range(3):
        compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        t0 = time.perf_counter()
        compiler.compile_structural_tag(tag)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, len(tag)


def main() -> None:
    info = xgr.TokenizerInfo.from_huggingface(tokenizer(), vocab_size=151936, stop_token_ids=[151645, 151643])
    rows = [(n, MAX_ANY_ORDER) for n in (2, 4, 8, 9, 16, 32)] + [(10, 10), (12, 12)]
    for n, group in rows:
        declared = arguments(n)
        t0 = time.perf_counter()
        grammar = any_order_arguments(declared, group)
        build = (time.perf_counter() - t0) * 1e3
        (ours, size), (theirs, base) = compile_ms(info, grammar), compile_ms(info, declared)
        print(f"n={n:2d} groups of {min(group, n):2d}  build {build:6.1f} ms  compile {ours:5.0f} ms vs declared "
              f"{theirs:5.0f} ms (x{ours / theirs:4.2f})  tag {size / 1e3:6.1f} kB vs {base / 1e3:4.1f} kB")


if __name__ == "__main__":
    main()
