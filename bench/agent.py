"""Prefix-reuse benchmark: a three-turn agent tool chain against `jaxchat serve` with prefix reuse on (the
default) and off (`--no-prefix-cache`), side by side in one run, with the ratio on / off of time to first
token per turn.

The conversation is fixed and built in code: a long system prompt (~1,300 tokens: 30 numbered agent rules),
8 tools with JSON-schema parameters (turn 1's prompt is ~2,200 tokens with Qwen2.5's template), and one user
request that needs two tool calls. Each turn is a streamed chat request with greedy decoding (temperature 0),
`max_tokens` (`--max-tokens`, 64) and `stream_options.include_usage`, sent with the official `openai` SDK:

- turn 1: system + user, `tool_choice: "required"`;
- turn 2: + the assistant message with the tool calls as streamed (reassembled from the deltas) and one
  `tool` message per call with a fixed fake result, `tool_choice: "required"`;
- turn 3: + the second call and its result, `tool_choice: "none"` (the final answer, as text; a tool call
  would stream its first delta only once its name is complete).

Per turn it records the time to first token (request sent -> first chunk carrying text, reasoning or a
tool call; for an empty reply the chunk carrying its finish reason), `usage.prompt_tokens` and
`usage.prompt_tokens_details.cached_tokens` (0 when absent). The chain runs `--repeats` times (2) per
server, each with a fresh `prompt_cache_key` but the same content; before them, unmeasured, one short
request per tool choice (another system prompt and user message, the same tools) compiles the tool
grammars. Repeat 1's turn 1 is the cold one: on the reuse server later repeats find the previous chain's
prefix, so turn 1's median mixes cold and warm.

The two servers are started one after the other (never together) as subprocesses on free 127.0.0.1 ports
with the same `--model`, `--max-batch` (2), `--max-context` (4096) and `--serve-arg`s, the second with
`--no-prefix-cache`; `--url-on` / `--url-off` drive an already running server instead of starting one.
Prints per turn the median TTFT on and off, their ratio, prompt and cached tokens, whether turns 2 and 3
meet the bar (on / off <= 0.3), and last one line per turn: `turn 2: on 0.41 s, off 3.20 s, ratio 0.13`.
`--json PATH` writes the config, the per-turn summary and every sample. Exit status 0 unless a request or
a server fails.

    python bench/agent.py [--model PATH] [--repeats 2] [--max-batch 2] [--max-context 4096] [--max-tokens 64]
                          [--serve-arg "--dtype bfloat16" ...] [--url-on URL] [--url-off URL] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from serve import free_port, start_server, stop_server, wait_healthy  # bench/serve.py (this directory is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
BAR = 0.3  # turns 2 and 3: TTFT with reuse <= BAR x TTFT without
TURN_CHOICES = ("required", "required", "none")

# ---- the conversation ---------------------------------------------------------------------------------

_TOPICS = [
    "weather questions", "web searches", "file reads", "file writes", "Python runs", "directory listings",
    "outgoing emails", "time and date questions", "ambiguous requests", "requests that touch personal data",
]
_RULES = [
    "Before acting on {t}, restate the user's goal to yourself in one sentence and decide whether a tool is "
    "needed at all; answer from the conversation when it already holds what the user asked for.",
    "For {t}, prefer the most specific tool available, pass only the arguments its schema declares, and use "
    "the exact names, paths, units and time zones the user gave instead of guessing new ones.",
    "When {t} fail or return something unexpected, say so plainly, never invent a result, and propose one "
    "concrete next step the user can approve or reject.",
]


def system_prompt() -> str:
    """The agent's instructions: a fixed header and 30 numbered rules (~1,300 tokens for Qwen2.5)."""
    rules = [rule.format(t=topic) for topic in _TOPICS for rule in _RULES]
    return "\n".join([
        "You are Atlas, a careful assistant that completes tasks for one user by calling tools. You run inside "
        "an automated harness: every tool call you make is executed and its result comes back as a tool "
        "message. Follow these rules, in order of priority when they conflict.",
        "",
        *(f"{i}. {rule}" for i, rule in enumerate(rules, 1)),
        "",
        "Call tools with valid JSON arguments only. When the task is done, answer in plain text.",
    ])


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


_STR = {"type": "string"}
TOOLS = [
    _tool("get_weather", "Current weather for a city.", {
        "city": {**_STR, "description": "city name, e.g. 'Lisbon'"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "temperature unit"}},
        ["city"]),
    _tool("search_web", "Search the web and return the top results.", {
        "query": {**_STR, "description": "the search query"},
        "max_results": {"type": "integer", "minimum": 1, "maximum": 10, "description": "how many results"}},
        ["query"]),
    _tool("read_file", "Read a text file from the workspace.", {
        "path": {**_STR, "description": "path relative to the workspace root"}}, ["path"]),
    _tool("write_file", "Write (create or replace) a text file in the workspace.", {
        "path": {**_STR, "description": "path relative to the workspace root"},
        "content": {**_STR, "description": "the whole new content of the file"}}, ["path", "content"]),
    _tool("run_python", "Run a Python snippet in a sandbox and return its stdout.", {
        "code": {**_STR, "description": "Python source to run"},
        "timeout_s": {"type": "number", "description": "time limit in seconds"}}, ["code"]),
    _tool("list_directory", "List the entries of a workspace directory.", {
        "path": {**_STR, "description": "directory path relative to the workspace root"},
        "recursive": {"type": "boolean", "description": "include subdirectories"}}, ["path"]),
    _tool("send_email", "Send an email on the user's behalf.", {
        "to": {"type": "array", "items": _STR, "description": "recipient addresses"},
        "subject": _STR, "body": _STR}, ["to", "subject", "body"]),
    _tool("get_time", "Current date and time in a time zone.", {
        "timezone": {**_STR, "description": "IANA time zone, e.g. 'Europe/Lisbon'"}}, ["timezone"]),
]
USER = ("What is the weather in Lisbon right now? Save a one-line summary of it to notes/lisbon.txt, "
        "then tell me exactly what you saved.")
FAKE_RESULTS = {
    "get_weather": {"city": "Lisbon", "temperature": 19, "unit": "celsius", "conditions": "light rain",
                    "wind_kmh": 14, "humidity": 81},
    "search_web": {"results": [{"title": "Lisbon weather today", "url": "https://example.com/lisbon",
                                "snippet": "Light rain, 19 C, wind 14 km/h."}]},
    "read_file": {"path": "notes/lisbon.txt", "content": "", "exists": False},
    "write_file": {"path": "notes/lisbon.txt", "bytes_written": 52, "ok": True},
    "run_python": {"stdout": "19\n", "stderr": "", "exit_code": 0},
    "list_directory": {"path": "notes", "entries": ["paris.txt", "todo.md"]},
    "send_email": {"sent": True, "message_id": "msg-0001"},
    "get_time": {"timezone": "Europe/Lisbon", "iso": "2025-03-14T09:30:00+00:00"},
}
WARMUP_SYSTEM = "Warm-up: use the tools."  # unlike system_prompt()'s opening words, so it seeds no reuse
WARMUP_USER = "Check the time in Tokyo."


def tool_message(call: dict) -> dict:
    result = FAKE_RESULTS.get(call["function"]["name"], {"ok": True})
    return {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)}


# ---- one chain ----------------------------------------------------------------------------------------

@dataclass
class Turn:
    turn: int
    ttft_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str | None
    calls: list[dict] = field(default_factory=list)  # [{"name", "arguments"}] as streamed
    content: str = ""
    empty: bool = False  # nothing streamed: ttft_s is the time to the finish chunk


def stream_turn(client, model: str, messages: list[dict], turn: int, choice: str, max_tokens: int,
                key: str) -> tuple[Turn, dict]:
    """One streamed request: its measurements and the assistant message reassembled from the deltas."""
    t0 = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, tool_choice=choice, temperature=0, max_tokens=max_tokens,
        stream=True, stream_options={"include_usage": True}, extra_body={"prompt_cache_key": key},
    )
    first, usage, finish, content, calls, empty = None, None, None, "", {}, False
    for chunk in stream:
        now = time.perf_counter()
        usage = chunk.usage or usage
        for c in chunk.choices:
            d = c.delta
            if d.content or d.tool_calls or getattr(d, "reasoning_content", None):
                first = first or now
            if c.finish_reason and first is None:  # an empty reply's first token is its end
                first, empty = now, True
            content += d.content or ""
            for tc in d.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": "", "type": "function",
                                                   "function": {"name": "", "arguments": ""}})
                call["id"] = tc.id or call["id"]
                if tc.function:
                    call["function"]["name"] += tc.function.name or ""
                    call["function"]["arguments"] += tc.function.arguments or ""
            finish = c.finish_reason or finish
    if first is None or usage is None:
        raise RuntimeError(f"turn {turn} streamed {'no usage' if first else 'no token'}")
    details = getattr(usage, "prompt_tokens_details", None)
    tool_calls = [calls[i] for i in sorted(calls)]
    assistant = {"role": "assistant", "content": content or None}
    if tool_calls:
        assistant["tool_calls"] = tool_calls
    sample = Turn(turn, first - t0, usage.prompt_tokens, (details and details.cached_tokens) or 0,
                  usage.completion_tokens, finish,
                  [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in tool_calls],
                  content, empty)
    return sample, assistant


def run_chain(client, model: str, max_tokens: int) -> list[Turn]:
    """The three turns of one conversation; each tool call is answered with its fixed fake result."""
    messages = [{"role": "system", "content": system_prompt()}, {"role": "user", "content": USER}]
    key = f"agent-{uuid.uuid4().hex[:16]}"
    turns = []
    for turn, choice in enumerate(TURN_CHOICES, 1):
        sample, assistant = stream_turn(client, model, messages, turn, choice, max_tokens, key)
        turns.append(sample)
        if turn == len(TURN_CHOICES):
            break
        if not assistant.get("tool_calls"):
            raise RuntimeError(f"turn {turn} (tool_choice {choice!r}) returned no tool call "
                               f"(finish_reason {sample.finish_reason}); try a larger --max-tokens")
        messages += [assistant, *(tool_message(call) for call in assistant["tool_calls"])]
    return turns


def warm_up(client, model: str) -> None:
    """One short request per tool choice of the chain (not measured): each compiles its tool grammar."""
    messages = [{"role": "system", "content": WARMUP_SYSTEM}, {"role": "user", "content": WARMUP_USER}]
    for choice in dict.fromkeys(TURN_CHOICES):
        with contextlib.suppress(RuntimeError):  # 8 tokens may end inside a tool call: nothing streamed
            stream_turn(client, model, messages, 0, choice, 8, "agent-warm-up")


def drive(url: str, args) -> tuple[str, list[list[Turn]]]:
    """The warm-up, then `args.repeats` measured chains against the server at `url`."""
    from openai import OpenAI

    client = OpenAI(base_url=url, api_key=args.api_key, max_retries=0, timeout=1800)
    model = client.models.list().data[0].id
    warm_up(client, model)
    chains = []
    for i in range(args.repeats):
        chains.append(run_chain(client, model, args.max_tokens))
        print(f"  chain {i + 1}/{args.repeats}: TTFT " + ", ".join(f"{t.ttft_s:.2f}" for t in chains[-1])
              + " s; cached " + ", ".join(f"{t.cached_tokens}/{t.prompt_tokens}" for t in chains[-1]), flush=True)
    client.close()
    return model, chains


# ---- the servers --------------------------------------------------------------------------------------

def api_url(url: str) -> str:
    """`http://host:port`, with or without `/v1`, as the SDK's base URL (ending in /v1)."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def launch(args, prefix_cache: bool, port: int, log: Path) -> subprocess.Popen:
    """`jaxchat serve` as bench/serve.py starts it, plus the reuse switch and the --serve-args."""
    extra = ([] if prefix_cache else ["--no-prefix-cache"]) + [a for x in args.serve_arg for a in shlex.split(x)]
    return start_server(args, port, log, tuple(extra))


def measure(args, side: str, url: str | None, logs: Path) -> dict:
    """Drive the server of `side` ("on" / "off"): the one at `url`, or one started here and stopped after."""
    if url:
        print(f"reuse {side}: {url}", flush=True)
        model, chains = drive(api_url(url), args)
        return {"url": url, "model": model, "chains": chains}
    port, log = free_port(), logs / f"serve-{side}.log"
    proc = launch(args, side == "on", port, log)
    try:
        ready = wait_healthy(proc, port, log, args.startup_timeout)
        print(f"reuse {side}: jaxchat serve ready in {ready:.0f} s (port {port}, log {log})", flush=True)
        model, chains = drive(api_url(f"http://127.0.0.1:{port}"), args)
    finally:
        code = stop_server(proc)
    return {"url": None, "model": model, "chains": chains, "server_ready_s": ready, "server_exit_code": code}


# ---- report -------------------------------------------------------------------------------------------

def summarize(on: list[list[Turn]], off: list[list[Turn]]) -> list[dict]:
    """Per turn: median TTFT / prompt / cached tokens of each side, and the TTFT ratio on / off."""
    rows = []
    for i in range(len(TURN_CHOICES)):
        row = {"turn": i + 1, "tool_choice": TURN_CHOICES[i]}
        for side, chains in (("on", on), ("off", off)):
            turns = [chain[i] for chain in chains]
            row[f"ttft_{side}_s"] = statistics.median(t.ttft_s for t in turns)
            row[f"prompt_tokens_{side}"] = statistics.median(t.prompt_tokens for t in turns)
            row[f"cached_tokens_{side}"] = statistics.median(t.cached_tokens for t in turns)
        row["ratio"] = row["ttft_on_s"] / row["ttft_off_s"]
        row["meets_bar"] = row["ratio"] <= BAR if i else None
        rows.append(row)
    return rows


def report(rows: list[dict]) -> str:
    lines = [f"{'turn':<6}{'choice':<10}{'TTFT on':>9}{'TTFT off':>10}{'on/off':>8}"
             f"{'prompt on':>11}{'cached on':>11}{'prompt off':>12}{'cached off':>12}"]
    for r in rows:
        lines.append(f"{r['turn']:<6}{r['tool_choice']:<10}{r['ttft_on_s']:>8.2f}s{r['ttft_off_s']:>9.2f}s"
                     f"{r['ratio']:>8.2f}{r['prompt_tokens_on']:>11.0f}{r['cached_tokens_on']:>11.0f}"
                     f"{r['prompt_tokens_off']:>12.0f}{r['cached_tokens_off']:>12.0f}")
    lines.append("")
    lines.append(f"bar: turns 2 and 3, TTFT with reuse <= {BAR} x without")
    for r in rows[1:]:
        lines.append(f"  turn {r['turn']}: {'ok' if r['meets_bar'] else 'BELOW BAR'} (ratio {r['ratio']:.2f})")
    return "\n".join(lines)


def caveats(on: list[list[Turn]], off: list[list[Turn]]) -> list[str]:
    """What makes the comparison suspect: different conversations, reuse not seen, reuse where it is off."""
    out = []
    calls = {json.dumps([t.calls for t in chain[:-1]]) for chain in on + off}
    if len(calls) > 1:
        out.append(f"the chains' tool calls differ ({len(calls)} variants), so their later prompts differ too")
    if any(t.cached_tokens for chain in off for t in chain):
        out.append("the reuse-off server reported cached tokens")
    if not any(t.cached_tokens for chain in on for t in chain[1:]):
        out.append("the reuse-on server reported no cached tokens in turns 2-3")
    if empty := sorted({t.turn for chain in on + off for t in chain if t.empty}):
        out.append(f"turn(s) {', '.join(map(str, empty))} streamed nothing in some chain: there TTFT is the "
                   "time to the end of the reply (max_tokens of decoding included)")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="HF dir, .gguf or orbax checkpoint (default: the default model)")
    p.add_argument("--repeats", type=int, default=2, help="measured chains per server")
    p.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every turn")
    p.add_argument("--max-batch", type=int, default=2, help="server slots")
    p.add_argument("--max-context", type=int, default=4096, help="server context per sequence")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARGS",
                   help="extra `jaxchat serve` arguments for both servers, shell-split (repeatable), "
                        "e.g. --serve-arg '--dtype bfloat16' or --serve-arg=--no-constrain")
    p.add_argument("--url-on", default=None, help="drive this running server (reuse on) instead of starting one")
    p.add_argument("--url-off", default=None, help="drive this running server (reuse off) instead of starting one")
    p.add_argument("--api-key", default=os.environ.get("JAXCHAT_API_KEY") or "bench")
    p.add_argument("--startup-timeout", type=float, default=900)
    p.add_argument("--json", default=None, metavar="PATH", help="write the results here")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.max_tokens < 1:
        p.error("--repeats and --max-tokens must be positive")

    t_start = time.perf_counter()
    logs = Path(tempfile.mkdtemp(prefix="jaxchat-agent-"))
    try:
        sides = {side: measure(args, side, url, logs) for side, url in (("on", args.url_on), ("off", args.url_off))}
    except BaseException:
        if any(logs.iterdir()):
            print(f"server logs kept in {logs}", file=sys.stderr)
        raise
    shutil.rmtree(logs, ignore_errors=True)
    on, off = sides["on"]["chains"], sides["off"]["chains"]
    rows = summarize(on, off)
    total = time.perf_counter() - t_start
    print(f"\nmodel {sides['on']['model']}, {args.repeats} chains per server, greedy, streaming, "
          f"max_tokens {args.max_tokens}; medians over the chains\n")
    print(report(rows))
    for w in caveats(on, off):
        print(f"warning: {w}")
    print(f"\ntotal {total:.0f} s")
    if args.json:
        result = {
            "benchmark": "agent", "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
            "config": vars(args), "bar": BAR, "total_s": total, "turns": rows,
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version()},
            "servers": {side: {**{k: v for k, v in s.items() if k != "chains"},
                               "chains": [[asdict(t) for t in chain] for chain in s["chains"]]}
                        for side, s in sides.items()},
            "caveats": caveats(on, off),
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2))
        print(f"wrote {args.json}")
    for r in rows:
        print(f"turn {r['turn']}: on {r['ttft_on_s']:.2f} s, off {r['ttft_off_s']:.2f} s, ratio {r['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
