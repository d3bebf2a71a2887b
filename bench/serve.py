"""End-to-end serving benchmark: `jaxchat serve` driven by the async `openai` SDK, constrained vs not.

Starts `jaxchat serve` as a subprocess on a free 127.0.0.1 port and, for each concurrency level
(closed loop: that many requests in flight at all times), streams a fixed chat request with greedy
decoding and a fixed length (`max_tokens`, `ignore_eos: true`). It measures

- output tokens/s (all completion tokens of the level / its wall time),
- time to first token (request sent -> first chunk carrying text or a tool call), p50 / p99,
- time per output token ((last chunk - first token) / (completion tokens - 1)), p50 / p99,

first unconstrained, then the same load with every request constrained (`--constraint json`: a
`json_schema` response format; `--constraint tools`: `tool_choice: "required"`; `--constraint mix`: request i
takes the i-th of a regex, a choice, an EBNF grammar, a JSON schema and a required tool call, in turn), and
prints the ratio
constrained / unconstrained of tokens/s per level (target >= 0.95). `--peer URL` then drives another
OpenAI-compatible server (a running `llama-server`, vLLM, SGLang) with the same client, request and
levels, unconstrained, once jaxchat's server has stopped, and prints jaxchat / peer per level (tokens/s and
TTFT p50). Both modes use the same messages;
in `json` mode the prompts are token for token the same. A constraint ends a request early when
its grammar completes, so the table also shows the mean tokens per request of each mode; under `mix` it
breaks the constrained level down by family (tokens per request, TTFT, the time to the first chunk, TPOT), and
runs a third level, `matched`: the same requests unconstrained, each as long as its family's constrained ones
were (greedy: a family always writes as many tokens), so mix / matched compares equal work. The host's speed
drifts by tens of percent over minutes on shared machines, so `--rounds N` runs the (mix, matched) pair of levels N
times in turn and reports each round's ratio, their median and the pooled ratio.

Writes `serve.json` (config, per-level figures, ratios) and `serve.png` into `--out`.

    python bench/serve.py [--model PATH] [--concurrency 1,4,16] [--max-tokens 32]
                          [--requests-per-level N] [--constraint json|tools|mix] [--rounds N]
                          [--out bench/results]
                          [--peer http://127.0.0.1:8080/v1]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

MESSAGES = [{"role": "user", "content": "Write a long story about a robot who learns to paint. "
                                        "Reply in JSON with a title and the story."}]
STORY_SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "story": {"type": "string"}},
    "required": ["title", "story"],
    "additionalProperties": False,
}
NOTE_TOOL = {
    "type": "function",
    "function": {
        "name": "save_story",
        "description": "Save a story",
        "parameters": {"type": "object", "properties": {"title": {"type": "string"}, "story": {"type": "string"}},
                       "required": ["title", "story"]},
    },
}


# `--constraint mix`: request i takes MIX[i % 5], one of each structured-output family (issue 51)
MIX_FAMILIES = ("regex", "choice", "ebnf", "json", "tools")
MIX = (
    {"structured_outputs": {"regex": r"[A-Z][a-z]{2,12}( [a-z]{1,12}){8,200}\."}},
    {"guided_choice": ["The robot painted the sunrise over the sea, slowly, in thin layers of orange and gold.",
                       "The robot painted a portrait of the old painter who had taught it to hold a brush.",
                       "The robot painted nothing at all, and the empty canvas sold for a fortune."]},
    {"ebnf": 'root ::= "Title: " word (" " word){0,6} "\\n" sentence{1,20}\n'
             'sentence ::= word (" " word){3,20} ". "\nword ::= [A-Za-z]{1,12}'},
    {"guided_json": STORY_SCHEMA},
    {"tools": [NOTE_TOOL], "tool_choice": "required"},
)
_mixed = itertools.count()


def request_fields(fields: dict) -> tuple[str, dict]:
    """A request's (family, constraint fields): `fields`, or under `mix` the next family's (under `matched`, the
    next family's name and no constraint: the unconstrained request of that family's length)."""
    if fields.get("mix") or fields.get("matched"):
        i = next(_mixed) % len(MIX)
        return MIX_FAMILIES[i], {} if fields.get("matched") else MIX[i]
    return "", fields


def constraint_fields(kind: str) -> dict:
    if kind == "mix":
        return {"mix": True}
    if kind == "json":
        return {"response_format": {"type": "json_schema",
                                    "json_schema": {"name": "story", "schema": STORY_SCHEMA, "strict": True}}}
    if kind == "tools":
        return {"tools": [NOTE_TOOL], "tool_choice": "required"}
    raise ValueError(f"--constraint must be json, tools or mix, not {kind!r}")


@dataclass
class Sample:
    ttft: float
    tpot: float | None
    tokens: int
    family: str = ""  # under `mix`: which structured-output family the request was
    first_chunk: float = 0.0  # request sent -> the first chunk (the role chunk, sent once the request is admitted)


@dataclass
class Level:
    mode: str
    concurrency: int
    requests: int
    round: int = 1  # under `mix` with `--rounds`: which (mix, matched) pair of levels this is
    wall_s: float = 0.0
    output_tokens: int = 0
    drafts: tuple[float, float] | None = None  # speculative tokens (drafted, accepted) during the level (/metrics)
    samples: list[Sample] = field(default_factory=list)

    def summary(self) -> dict:
        ttft = [s.ttft for s in self.samples]
        tpot = [s.tpot for s in self.samples if s.tpot is not None]

        def pct(xs, q):
            return float(np.percentile(xs, q)) if xs else float("nan")

        return {
            "mode": self.mode, "concurrency": self.concurrency, "requests": self.requests, "round": self.round,
            "wall_s": self.wall_s, "output_tokens": self.output_tokens,
            "output_tokens_per_s": self.output_tokens / self.wall_s if self.wall_s else 0.0,
            "mean_tokens_per_request": self.output_tokens / max(1, len(self.samples)),
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99),
            "tpot_p50_s": pct(tpot, 50), "tpot_p99_s": pct(tpot, 99),
            "drafted_tokens": self.drafts[0] if self.drafts else None,
            "accepted_drafts": self.drafts[1] if self.drafts else None,
            "first_chunk_p99_s": pct([s.first_chunk for s in self.samples], 99),
            "families": {f: _family(self.samples, f, pct) for f in sorted({s.family for s in self.samples} - {""})},
        }


def _family(samples: list[Sample], family: str, pct) -> dict:
    """One family's figures within a mixed level: how long its requests are and where its first token comes."""
    mine = [s for s in samples if s.family == family]
    ttft = [s.ttft for s in mine]
    return {"requests": len(mine), "mean_tokens_per_request": sum(s.tokens for s in mine) / max(1, len(mine)),
            "ttft_p50_s": pct(ttft, 50), "ttft_max_s": max(ttft, default=float("nan")),
            "first_chunk_max_s": max((s.first_chunk for s in mine), default=float("nan")),
            "tpot_p50_s": pct([s.tpot for s in mine if s.tpot is not None], 50)}


# ---- the server ---------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, port: int, log_path: Path, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """`jaxchat serve` of this environment with the benchmark's shapes (and `extra` flags) on `port`."""
    exe = shutil.which("jaxchat", path=str(Path(sys.executable).parent))
    cmd = [exe] if exe else [sys.executable, "-m", "jaxchat.cli"]
    cmd += ["serve", "--host", "127.0.0.1", "--port", str(port), "--max-batch", str(args.max_batch),
            "--max-context", str(args.max_context), "--log-level", "warning"]
    if args.model:
        cmd += ["--model", args.model]
    cmd += extra
    env = {**os.environ, "TQDM_DISABLE": "1"}
    with open(log_path, "w") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)


def wait_healthy(proc: subprocess.Popen, port: int, log_path: Path, timeout: float) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if proc.poll() is not None:
            raise SystemExit(f"jaxchat serve exited with {proc.returncode}; its log:\n{log_path.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"jaxchat serve was not healthy after {timeout:.0f} s; see {log_path}")


def stop_server(proc: subprocess.Popen) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


# ---- the load -----------------------------------------------------------------------------------------

async def one_request(client, model: str, fields: dict, max_tokens: int) -> Sample:
    t0 = time.perf_counter()
    first = last = opened = None
    tokens = 0
    family, extra = request_fields(fields)
    if fields.get("matched"):  # as many tokens as the constrained requests of its family wrote
        max_tokens = fields["matched"][family]
    stream = await client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True, **extra},
    )
    async for chunk in stream:
        now = time.perf_counter()
        opened = opened or now
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            d = choice.delta
            if d.content or d.tool_calls or getattr(d, "reasoning_content", None):
                first = first or now
                last = now
            if choice.finish_reason:
                last = now
    if first is None:
        raise RuntimeError("a request streamed no text")
    tpot = (last - first) / (tokens - 1) if tokens > 1 else None
    return Sample(first - t0, tpot, tokens, family, opened - t0)


def draft_counts(base_url: str) -> tuple[float, float] | None:
    """jaxchat's speculative counters (drafted, accepted tokens) from /metrics; None from a server without them."""
    try:
        with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in ("jaxchat_spec_draft_tokens_total", "jaxchat_spec_accepted_tokens_total"):
            values[name] = float(value)
    if len(values) < 2:
        return None
    return values["jaxchat_spec_draft_tokens_total"], values["jaxchat_spec_accepted_tokens_total"]


async def run_level(client, model: str, level: Level, fields: dict, max_tokens: int, bar) -> None:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(level.requests):
        queue.put_nowait(i)

    async def worker():
        while True:
            try:
                queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            sample = await one_request(client, model, fields, max_tokens)
            level.samples.append(sample)
            level.output_tokens += sample.tokens
            bar.update(1)

    base_url = str(client.base_url).rstrip("/")
    before = await asyncio.to_thread(draft_counts, base_url)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(level.concurrency)))
    level.wall_s = time.perf_counter() - t0
    after = await asyncio.to_thread(draft_counts, base_url)
    if before is not None and after is not None:
        level.drafts = (after[0] - before[0], after[1] - before[1])


async def drive(args, base_url: str, modes: tuple[str, ...]) -> tuple[str, list[Level]]:
    """Run every level of `modes` ("unconstrained", the constraint kind, or "peer": unconstrained against
    another server) against the OpenAI-compatible server at `base_url` (ending in /v1)."""
    from openai import AsyncOpenAI
    from tqdm import tqdm

    client = AsyncOpenAI(base_url=base_url, api_key=os.environ.get("PEER_API_KEY", "bench"), max_retries=0,
                         timeout=1800)
    model = (await client.models.list()).data[0].id
    mode_fields = {m: constraint_fields(args.constraint) if m == args.constraint else {} for m in modes}
    # warm-up, not measured: a full round at the largest concurrency per mode (the grammar is compiled
    # and cached on its first use; every batch bucket and the whole KV cache get touched once)
    for fields in mode_fields.values():
        await asyncio.gather(*(one_request(client, model, fields, 16) for _ in range(max(args.concurrency))))
    levels = []
    for c in args.concurrency:
        n = args.requests_per_level or max(4, 2 * c)
        levels += [Level(m, c, n) for m in modes]
    matched = args.constraint == "mix" and "unconstrained" in modes
    rounds = args.rounds if matched else 1
    total = sum(lv.requests for lv in levels) * (1.5 if matched else 1) + sum(
        2 * lv.requests * (rounds - 1) for lv in levels if lv.mode == "mix")
    with tqdm(total=int(total), unit="req", desc="serve bench") as bar:
        for level in levels:
            bar.set_postfix_str(f"{level.mode} c={level.concurrency}")
            fields = mode_fields[level.mode]
            await run_level(client, model, level, fields, args.max_tokens, bar)
        if matched:  # unconstrained again, each request as long as its family's constrained ones were
            for mixed in [lv for lv in levels if lv.mode == "mix"]:
                lengths = {f: max(1, round(v["mean_tokens_per_request"]))
                           for f, v in mixed.summary()["families"].items()}
                level = Level("matched", mixed.concurrency, mixed.requests)
                bar.set_postfix_str(f"matched c={level.concurrency}")
                await run_level(client, model, level, {"matched": lengths}, args.max_tokens, bar)
                levels.append(level)
                for r in range(2, rounds + 1):  # the host's speed drifts: more (mix, matched) pairs, alternating
                    for mode, fields in (("mix", mode_fields["mix"]), ("matched", {"matched": lengths})):
                        level = Level(mode, mixed.concurrency, mixed.requests, round=r)
                        bar.set_postfix_str(f"{mode} c={level.concurrency} round {r}")
                        await run_level(client, model, level, fields, args.max_tokens, bar)
                        levels.append(level)
    await client.close()
    return model, levels


# ---- report -------------------------------------------------------------------------------------------

def report(summaries: list[dict], constraint: str) -> tuple[str, list[dict]]:
    lines = [f"{'mode':<14}{'conc':>5}{'reqs':>6}{'tok/req':>8}{'tok/s':>9}"
             f"{'TTFT p50':>10}{'TTFT p99':>10}{'TPOT p50':>10}{'TPOT p99':>10}"]
    for s in summaries:
        mode = s["mode"] + (f" r{s['round']}" if s["round"] > 1 else "")
        drafts = ("" if s.get("drafted_tokens") is None else
                  f"  drafts {s['accepted_drafts']:.0f}/{s['drafted_tokens']:.0f} accepted")
        lines.append(f"{mode:<14}{s['concurrency']:>5}{s['requests']:>6}{s['mean_tokens_per_request']:>8.1f}"
                     f"{s['output_tokens_per_s']:>9.2f}{s['ttft_p50_s']:>9.2f}s{s['ttft_p99_s']:>9.2f}s"
                     f"{s['tpot_p50_s'] * 1e3:>8.0f}ms{s['tpot_p99_s'] * 1e3:>8.0f}ms{drafts}")
    for s in summaries:
        if s.get("families") and s["round"] == 1:
            lines.append(f"  {s['mode']} c={s['concurrency']} by family (first chunk: the role chunk, sent once "
                         f"the request is admitted; p99 over all {s['first_chunk_p99_s']:.2f}s):")
            for name, f in s["families"].items():
                lines.append(f"    {name:<8}{f['requests']:>4} reqs {f['mean_tokens_per_request']:>6.1f} tok/req  "
                             f"TTFT p50 {f['ttft_p50_s']:.2f}s max {f['ttft_max_s']:.2f}s  first chunk max "
                             f"{f['first_chunk_max_s']:.2f}s  TPOT p50 {f['tpot_p50_s'] * 1e3:.0f}ms")
    rounds = [s for s in summaries if s["round"] > 1]
    summaries = [s for s in summaries if s["round"] == 1]
    ratios = []
    lines.append("")
    lines.append(f"constrained ({constraint}) / unconstrained, per concurrency (target >= 0.95):")
    by = {(s["mode"], s["concurrency"]): s for s in summaries}
    for c in sorted({s["concurrency"] for s in summaries}):
        u, k = by[("unconstrained", c)], by[(constraint, c)]
        r = {"concurrency": c,
             "tokens_per_s": k["output_tokens_per_s"] / u["output_tokens_per_s"],
             "tpot_p50": u["tpot_p50_s"] / k["tpot_p50_s"]}
        ratios.append(r)
        ok = "ok" if r["tokens_per_s"] >= 0.95 else "BELOW TARGET"
        lines.append(f"  c={c:<3} tokens/s ratio {r['tokens_per_s']:.3f} ({ok}); "
                     f"per-token speed ratio (TPOT p50 unconstrained / constrained) {r['tpot_p50']:.3f}")
    if ("matched", min(s["concurrency"] for s in summaries)) in by:
        lines.append("")
        lines.append("mix / matched (unconstrained, each request as long as its family's constrained ones), per "
                     "concurrency (target >= 0.95):")
        for c in sorted({s["concurrency"] for s in summaries}):
            u, k = by[("matched", c)], by[(constraint, c)]
            r = {"concurrency": c, "matched_tokens_per_s": k["output_tokens_per_s"] / u["output_tokens_per_s"],
                 "matched_tpot_p50": u["tpot_p50_s"] / k["tpot_p50_s"],
                 "matched_ttft_p99": k["ttft_p99_s"] / u["ttft_p99_s"]}
            ratios.append(r)
            ok = "ok" if r["matched_tokens_per_s"] >= 0.95 else "BELOW TARGET"
            lines.append(f"  c={c:<3} tokens/s ratio {r['matched_tokens_per_s']:.3f} ({ok}); per-token speed ratio "
                         f"{r['matched_tpot_p50']:.3f}; TTFT p99 mix / matched {r['matched_ttft_p99']:.2f}")
    if rounds:
        lines += ["", "mix / matched tokens/s, each round a (mix, matched) pair run one after the other (round 1 is "
                  "the table's); the median and the pooled ratio (all rounds' tokens over their time):"]
        for c in sorted({s["concurrency"] for s in summaries}):
            pairs = [(by[("mix", c)], by[("matched", c)])] + [
                (k, u) for k in rounds for u in rounds
                if k["mode"] == "mix" and u["mode"] == "matched" and k["round"] == u["round"] and
                k["concurrency"] == u["concurrency"] == c]
            each = [k["output_tokens_per_s"] / u["output_tokens_per_s"] for k, u in pairs]

            def rate(levels):
                return sum(x["output_tokens"] for x in levels) / sum(x["wall_s"] for x in levels)

            r = {"concurrency": c, "rounds": each, "rounds_median": float(np.median(each)),
                 "rounds_pooled": rate([k for k, _ in pairs]) / rate([u for _, u in pairs])}
            ratios.append(r)
            ok = "ok" if r["rounds_median"] >= 0.95 else "BELOW TARGET"
            lines.append(f"  c={c:<3} per round {' '.join(f'{x:.3f}' for x in each)}; median {r['rounds_median']:.3f} "
                         f"({ok}); pooled {r['rounds_pooled']:.3f}")
    if ("peer", min(s["concurrency"] for s in summaries)) in by:
        lines.append("")
        lines.append("jaxchat / peer (the same client and load, unconstrained), per concurrency:")
        for c in sorted({s["concurrency"] for s in summaries}):
            u, p = by[("unconstrained", c)], by[("peer", c)]
            r = {"concurrency": c, "peer_tokens_per_s": u["output_tokens_per_s"] / p["output_tokens_per_s"],
                 "peer_ttft_p50": u["ttft_p50_s"] / p["ttft_p50_s"]}
            ratios.append(r)
            lines.append(f"  c={c:<3} tokens/s ratio {r['peer_tokens_per_s']:.3f}; "
                         f"TTFT p50 ratio (jaxchat / peer) {r['peer_ttft_p50']:.2f}")
    return "\n".join(lines), ratios


def plot(summaries: list[dict], constraint: str, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    panels = [("output_tokens_per_s", "output tokens/s", 1), ("ttft_p50_s", "TTFT p50 (s)", 1),
              ("tpot_p50_s", "TPOT p50 (ms)", 1e3)]
    for ax, (key, label, scale) in zip(axes, panels, strict=True):
        for mode, marker in (("unconstrained", "o-"), (constraint, "s--"), ("peer", "^:")):
            rows = [s for s in summaries if s["mode"] == mode and s["round"] == 1]
            if not rows:
                continue
            ax.plot([s["concurrency"] for s in rows], [s[key] * scale for s in rows], marker, label=mode)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted({s["concurrency"] for s in summaries}))
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
        ax.set_xlabel("concurrency")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="HF dir, .gguf or orbax checkpoint (default: the default model)")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated concurrency levels")
    p.add_argument("--max-tokens", type=int, default=32, help="output tokens per request (eos ignored)")
    p.add_argument("--requests-per-level", type=int, default=None,
                   help="requests per level and mode (default: 2 x concurrency, at least 4)")
    p.add_argument("--constraint", choices=("json", "tools", "mix"), default="json",
                   help="json: a json_schema response format; tools: tool_choice required")
    p.add_argument("--rounds", type=int, default=1,
                   help="under --constraint mix: run the (mix, matched) pair of levels this many times in turn and "
                        "report each round's ratio, their median and the pooled ratio (the host's speed drifts)")
    p.add_argument("--max-batch", type=int, default=None, help="server slots (default: the largest concurrency)")
    p.add_argument("--max-context", type=int, default=512, help="server context per sequence")
    p.add_argument("--serve-args", default="", metavar="FLAGS",
                   help="more flags for jaxchat serve, one string (e.g. \"--speculative off\")")
    p.add_argument("--startup-timeout", type=float, default=900)
    p.add_argument("--out", default=str(ROOT / "bench" / "results"))
    p.add_argument("--peer", default=None, metavar="URL",
                   help="also drive this OpenAI-compatible server (e.g. http://127.0.0.1:8080/v1 of a running "
                        "llama-server) with the same client and unconstrained load, after jaxchat's own run, and "
                        "print jaxchat / peer per level (API key from $PEER_API_KEY)")
    args = p.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if not args.concurrency or min(args.concurrency) < 1 or args.max_tokens < 2:
        p.error("--concurrency needs positive levels and --max-tokens at least 2")
    if args.rounds < 1 or (args.rounds > 1 and args.constraint != "mix"):
        p.error("--rounds needs --constraint mix and at least 1")
    args.max_batch = args.max_batch or max(args.concurrency)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    t_start = time.perf_counter()
    port = free_port()
    log_path = out / "serve.log"
    proc = start_server(args, port, log_path, tuple(shlex.split(args.serve_args)))
    try:
        ready_s = wait_healthy(proc, port, log_path, args.startup_timeout)
        print(f"jaxchat serve ready in {ready_s:.0f} s (port {port}, max batch {args.max_batch}, "
              f"context {args.max_context})", flush=True)
        model, levels = asyncio.run(drive(args, f"http://127.0.0.1:{port}/v1", ("unconstrained", args.constraint)))
    finally:
        code = stop_server(proc)
    if args.peer:  # after jaxchat's server has stopped: the two never share the machine
        peer_model, peer_levels = asyncio.run(drive(args, args.peer.rstrip("/"), ("peer",)))
        print(f"peer {args.peer}: model {peer_model}", flush=True)
        levels += peer_levels
    summaries = [lv.summary() for lv in levels]
    text, ratios = report(summaries, args.constraint)
    total = time.perf_counter() - t_start
    print(f"\nmodel {model}, {args.max_tokens} output tokens per request (ignore_eos), greedy, streaming\n")
    print(text)
    print(f"\ntotal {total:.0f} s (server start {ready_s:.0f} s); server exit code {code}")
    result = {
        "benchmark": "serve", "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "model": model, "config": {k: v for k, v in vars(args).items()},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "server_ready_s": ready_s, "total_s": total, "server_exit_code": code,
        "levels": summaries, "ratios": ratios,
        "samples": {f"{lv.mode}@{lv.concurrency}" + (f"#{lv.round}" if lv.round > 1 else ""): [asdict(s) for s in lv.samples] for lv in levels},
    }
    (out / "serve.json").write_text(json.dumps(result, indent=2))
    plot(summaries, args.constraint, out / "serve.png",
         f"jaxchat serve, {model}, {args.max_tokens} tokens/request, constrained = {args.constraint}")
    print(f"wrote {out / 'serve.json'} and {out / 'serve.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
