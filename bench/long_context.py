"""Long-context serving on the real default model: `jaxchat serve --max-batch 64 --max-context 32768`.

The run CI checks on a random checkpoint of the same KV geometry (tests/e2e/test_long_context_server.py), here on
the real weights (Qwen2.5-Coder-0.5B-Instruct): the server starts with its pool sized by memory, 48 concurrent
requests (8 greedy tokens each) give the replies the same requests give alone, and a prompt of 16,500 tokens is
answered. Prints the start-up time and the pool line, the 48 requests' wall time together and one after the other
(their ratio is what continuous batching buys), the long prompt's prefill rate, and the server's resident memory.

    python bench/long_context.py [--model PATH] [--max-batch 64] [--max-context 32768] [--long 16500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_gib(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * 4096 / (1 << 30)


def start(args: argparse.Namespace, log: Path) -> tuple[subprocess.Popen, str, float]:
    port = _free_port()
    cmd = [sys.executable, "-m", "jaxchat.cli", "serve", "--port", str(port), "--max-batch", str(args.max_batch),
           "--max-context", str(args.max_context), *(["--model", args.model] if args.model else [])]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    base = f"http://127.0.0.1:{port}"
    while time.perf_counter() - t0 < 3600:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, base, time.perf_counter() - t0
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("server not healthy within an hour")


def prompts(n: int) -> list[list[int]]:
    """n distinct prompts of 5..60 token ids (the same as the CI test's)."""
    return [[(97 * i + 13 * j) % 5000 + 200 for j in range(5 + (7 * i) % 56)] for i in range(n)]


async def complete(client: httpx.AsyncClient, base: str, prompt: list[int], max_tokens: int) -> dict:
    model = (await client.get(base + "/v1/models")).json()["data"][0]["id"]
    r = await client.post(base + "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                          "temperature": 0})
    r.raise_for_status()
    return r.json()


async def measure(base: str, concurrent: int, long: int) -> dict:
    async with httpx.AsyncClient(timeout=7200) as client:
        batch = prompts(concurrent)
        t0 = time.perf_counter()
        together = await asyncio.gather(*(complete(client, base, p, 8) for p in batch))
        t_together = time.perf_counter() - t0
        t0 = time.perf_counter()
        alone = [await complete(client, base, p, 8) for p in batch]
        t_alone = time.perf_counter() - t0
        t0 = time.perf_counter()
        reply = await complete(client, base, [(31 * j) % 20000 + 300 for j in range(long)], 4)
        t_long = time.perf_counter() - t0
    same = [a["choices"][0]["text"] for a in together] == [b["choices"][0]["text"] for b in alone]
    return {"concurrent": concurrent, "together_s": round(t_together, 2), "alone_s": round(t_alone, 2),
            "batching_speedup": round(t_alone / t_together, 2), "together_equals_alone": same,
            "long_prompt_tokens": reply["usage"]["prompt_tokens"], "long_prompt_s": round(t_long, 1),
            "long_prefill_tok_s": round(reply["usage"]["prompt_tokens"] / t_long, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="default: the default model asset")
    ap.add_argument("--max-batch", type=int, default=64)
    ap.add_argument("--max-context", type=int, default=32768)
    ap.add_argument("--concurrent", type=int, default=48)
    ap.add_argument("--long", type=int, default=16500)
    args = ap.parse_args()
    log = Path(tempfile.mkdtemp(prefix="jaxchat-long-context-")) / "serve.log"
    proc, base, ready_s = start(args, log)
    try:
        figures = asyncio.run(measure(base, args.concurrent, args.long))
        figures["rss_gib"] = round(rss_gib(proc.pid), 2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    text = log.read_text()
    pool = re.search(r"KV pool: .*", text)
    figures.update(ready_s=round(ready_s, 1), pool=pool.group(0) if pool else None,
                   clean_log="Traceback" not in text and "engine step failed" not in text)
    for key, value in figures.items():
        print(f"{key:24s} {value}")
    print(json.dumps(figures))
    return 0 if figures["together_equals_alone"] and figures["clean_log"] and figures["long_prompt_tokens"] > 16384 else 1


if __name__ == "__main__":
    sys.exit(main())
