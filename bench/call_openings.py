"""How surely a model opens its reply with a call, per BFCL case: the first token's distribution under
tool_choice "auto", read through a server's logprobs.

Contract: for each case of `--categories` (the cases and tools of `bench/function_calling.py`, the same
request with `max_tokens` 1, `logprobs` and `top_logprobs` 20), the probability that the reply's first token
opens a call: a call envelope (a token that starts, after whitespace, with ```` ``` ````, `{` or `[`) or
the template's own call marker (`--marker`, default `<tool_call>`). Mass outside the top 20 is not counted,
so each figure is a lower bound. With `--calls-from PATH` (a `function_calling.py --json` file of the same
server and cases) every case is grouped by whether that run's reply to it made a tool call, so the
irrelevance cases that were answered with a call can be set beside the calling categories.

    python bench/call_openings.py --base-url http://127.0.0.1:8123/v1 [--categories simple,...,irrelevance]
        [--n 25] [--calls-from /tmp/fc_auto.json] [--irrelevance-bar 0.85] [--json PATH]
    python bench/call_openings.py --rows-from PATH --calls-from /tmp/fc_auto.json   # no server: a --json file

Prints per group: cases, and the median, minimum and maximum of P(envelope) and P(marker). A logprob a
server reports after a grammar's mask is the same here: under "auto" the first token is free.

With `--calls-from`, it also answers whether a confidence gate could reach `--irrelevance-bar` (0.85):
the lowest threshold t such that dropping every call whose reply opens with P(envelope) <= t leaves that
share of irrelevance cases without a call, and what each calling category's accuracy would then be
(its right answers whose P(envelope) > t).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from function_calling import CATEGORIES, load_cases, model_id, openai_tools  # noqa: E402

ENVELOPE_STARTS = ("```", "{", "[")


def opening_mass(top: list[dict], marker: str) -> tuple[float, float]:
    """(P(an envelope opens), P(the marker opens)) summed over the top tokens `[{token, logprob}]`."""
    envelope = sum(math.exp(t["logprob"]) for t in top if t["token"].lstrip().startswith(ENVELOPE_STARTS))
    native = sum(math.exp(t["logprob"]) for t in top if t["token"] == marker)
    return envelope, native


def first_token(client: httpx.Client, base_url: str, model: str, case: dict) -> list[dict]:
    body = {
        "model": model,
        "messages": case["question"][0],
        "tools": openai_tools(case["function"]),
        "tool_choice": "auto",
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": True,
        "top_logprobs": 20,
    }
    r = client.post(f"{base_url}/chat/completions", json=body)
    r.raise_for_status()
    return r.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]


def verdicts_in(path: str | None) -> dict[str, tuple[bool, bool]]:
    """{case id: (the reply made a tool call, the case is right)} from a function_calling.py --json file (auto)."""
    if not path:
        return {}
    data = json.loads(Path(path).read_text())
    run = next(iter(data["runs"].values()))
    return {r["id"]: (bool(r["calls"]), r["correct"]) for rs in run["results"].get("auto", {}).values() for r in rs}


def probe(base_url: str, model: str | None, categories: list[str], n: int, marker: str) -> tuple[str, list[dict]]:
    rows = []
    with httpx.Client(timeout=600) as client:
        model = model or model_id(client, base_url)
        for category in categories:
            for case, _ in load_cases(category, n):
                envelope, native = opening_mass(first_token(client, base_url, model, case), marker)
                rows.append({"id": case["id"], "category": category, "p_envelope": envelope, "p_marker": native})
    return model, rows


def gate(rows: list[dict], verdicts: dict[str, tuple[bool, bool]], bar: float) -> None:
    """Print the confidence gate that would reach `bar` on irrelevance and what it costs elsewhere."""
    irrelevant = [r for r in rows if r["category"] == "irrelevance" and r["id"] in verdicts]
    if not irrelevant:
        return
    called = sorted(r["p_envelope"] for r in irrelevant if verdicts[r["id"]][0])
    to_drop = max(0, math.ceil(bar * len(irrelevant) - 1e-9) - (len(irrelevant) - len(called)))
    print(f"\na gate reaching {bar:.0%} on irrelevance must drop {to_drop} of its {len(called)} calls", end="")
    if to_drop == 0:
        print(": none needed")
        return
    threshold = called[to_drop - 1]
    print(f": every call whose reply opens with P(envelope) <= {threshold:.2f}")
    for category in dict.fromkeys(r["category"] for r in rows):
        if category == "irrelevance":
            continue
        cases = [r for r in rows if r["category"] == category and r["id"] in verdicts]
        if not cases:
            continue
        right = [r for r in cases if verdicts[r["id"]][1]]
        kept = [r for r in right if r["p_envelope"] > threshold]
        print(f"  {category:<20} {len(right)}/{len(cases)} right now, {len(kept)}/{len(cases)} behind the gate")


def summary(values: list[float]) -> str:
    if not values:
        return "n/a"
    return f"median {statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", help="the server's OpenAI base URL (not needed with --rows-from)")
    ap.add_argument("--model", help="model id (default: the first of GET /models)")
    ap.add_argument("--categories", default=",".join(CATEGORIES))
    ap.add_argument("--n", type=int, default=25)
    ap.add_argument("--marker", default="<tool_call>", help="the template's own call marker token")
    ap.add_argument("--calls-from", help="a function_calling.py --json file: group cases by whether they called")
    ap.add_argument("--irrelevance-bar", type=float, default=0.85)
    ap.add_argument("--rows-from", help="an earlier run's --json file: read its figures instead of asking a server")
    ap.add_argument("--json", help="write every case's figures here")
    args = ap.parse_args(argv)
    categories = [c for c in args.categories.split(",") if c]
    for c in categories:
        if c not in CATEGORIES:
            ap.error(f"unknown category {c!r}; known: {', '.join(CATEGORIES)}")
    if args.rows_from:
        saved = json.loads(Path(args.rows_from).read_text())
        model, rows = saved["model"], [r for r in saved["rows"] if r["category"] in categories]
    elif args.base_url:
        model, rows = probe(args.base_url.rstrip("/"), args.model, categories, args.n, args.marker)
    else:
        ap.error("give --base-url or --rows-from")
    verdicts = verdicts_in(args.calls_from)
    groups: dict[str, list[dict]] = {}
    for row in rows:
        group = row["category"]
        if row["id"] in verdicts:
            group += ", called" if verdicts[row["id"]][0] else ", no call"
        groups.setdefault(group, []).append(row)
    print(f"{model}: P(the reply's first token opens a call), top 20 tokens, tool_choice auto")
    print(f"{'group':<30}{'cases':>6}  {'P(envelope)':<38}P({args.marker})")
    for group, members in groups.items():
        envelope, native = [r["p_envelope"] for r in members], [r["p_marker"] for r in members]
        print(f"{group:<30}{len(members):>6}  {summary(envelope):<38}{summary(native)}")
    gate(rows, verdicts, args.irrelevance_bar)
    if args.json:
        Path(args.json).write_text(json.dumps({"model": model, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
