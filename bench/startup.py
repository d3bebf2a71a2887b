"""Start-up benchmark: `jaxchat serve` from spawning it to the first answered tool call, cold (an empty
compilation cache and executable store; the converted-weights cache (and, since `python -m jaxchat.prepare`,
the grammar engine's tokenizer info) as `scripts/bootstrap.sh` left it, or the weights removed with
`--clear-weights`; for the default model, each checkout's own asset preparation runs first, untimed, as
scripts/bootstrap.sh does) and warm (the caches the cold start filled), and with `--against DIR` another
checkout side by side in the same run, with the ratios this / other.

Each start is a subprocess on a free 127.0.0.1 port with its own `--compile-cache` directory (a fresh
temporary one for the cold start, the same one again for the warm start). The time to /health is shown too,
and each start's log line "Warm-up: ..." (how many programs before serving, compiled or loaded). A start is
stopped only once every program is ready (`programs_ready` in /health), so the warm start finds them stored.
`--runs K` repeats it all K times on fresh caches.

    python bench/startup.py [--model PATH] [--max-batch 8] [--max-context 4096] [--runs 1] [--against DIR]
        [--keep-logs DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from own_cache import own_cache

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TOOL_CALL = {
    "messages": [{"role": "user", "content": "What is the weather in Paris? Use the tool."}],
    "tools": [{"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "tool_choice": "required", "max_tokens": 48, "temperature": 0,
}


def _get_json(url: str, timeout: float = 10) -> tuple[int, dict]:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, json.loads(r.read() or b"{}")


def time_to_first_call(args: argparse.Namespace, cache: Path, log: Path, root: Path = ROOT,
                       assets: Path | None = None) -> dict:
    """Start `jaxchat serve` (of the checkout at `root`); seconds from spawning it to /health answering 200 and to
    the first answered tool call (a `tool_choice: required` chat completion), its warm-up log line, and the call it
    made. Before stopping it, waits for every program to be ready (`programs_ready` in /health, when it has it), so
    the warm start after it finds them all stored."""
    port = _free_port()
    cmd = [sys.executable, "-m", "jaxchat.cli", "serve", "--port", str(port), "--max-batch", str(args.max_batch),
           "--max-context", str(args.max_context), "--compile-cache", str(cache)]
    if args.model:
        cmd += ["--model", args.model]
    env = {**os.environ, "PYTHONPATH": str(root), **({"JAXCHAT_CACHE": str(assets)} if assets else {})}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    base = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if _get_json(base + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        health = time.perf_counter() - t0
        request = urllib.request.Request(base + "/v1/chat/completions", json.dumps(TOOL_CALL).encode(),
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=600) as r:
            reply = json.loads(r.read())
        first_call = time.perf_counter() - t0
        calls = reply["choices"][0]["message"].get("tool_calls") or []
        if not calls:
            raise SystemExit(f"no tool call in the reply: {reply}")
        while True:  # every program stored before this server stops (the next start is the warm one)
            body = _get_json(base + "/health")[1]
            if body.get("programs_ready", 0) >= body.get("programs_total", 0):
                break
            time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    found = re.search(r"Warm-up: .*", log.read_text())
    return {"health": health, "first_call": first_call, "warmup": found.group(0) if found else "(no warm-up line)",
            "call": calls[0]["function"]}


def clear_dequantized(model: str | None) -> None:
    """Remove the GGUF model's cached dequantised weights (`gguf_loader.dequantized_cache_file`)."""
    sys.path.insert(0, str(ROOT))
    from jaxchat.assets import DEFAULT_MODEL, asset_path
    from jaxchat.models.gguf_loader import dequantized_cache_file

    path = Path(model) if model else asset_path(DEFAULT_MODEL)
    cached = dequantized_cache_file(path) if path.suffix == ".gguf" else None
    if cached is not None:
        cached.unlink(missing_ok=True)


def prepare_assets(root: Path, assets: Path | None = None) -> None:
    """What scripts/bootstrap.sh's asset preparation does for the default model in the checkout at `root` (its own
    `python -m jaxchat.prepare`, or before that existed `python -m jaxchat.models.prepare_assets`; its own cache
    formats): a newcomer's first start finds it. Not timed; a checkout with neither is left as it is."""
    module = next((m for m in ("jaxchat.prepare", "jaxchat.models.prepare_assets")
                   if (root / (m.replace(".", "/") + ".py")).exists()), None)
    if module is not None:
        sys.path.insert(0, str(ROOT))
        from jaxchat.assets import DEFAULT_MODEL

        subprocess.run([sys.executable, "-m", module, DEFAULT_MODEL], cwd=root, check=True,
                       env={**os.environ, "PYTHONPATH": str(root), **({"JAXCHAT_CACHE": str(assets)} if assets else {})},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: the default model asset")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--against", default=None, metavar="DIR", help="another checkout to start side by side")
    ap.add_argument("--clear-weights", action="store_true",
                    help="remove the converted-weights cache before each cold start (default: keep what "
                         "scripts/bootstrap.sh's asset fetch filled, as a newcomer's first start finds it)")
    ap.add_argument("--keep-logs", default=None, metavar="DIR", help="keep each start's log (and caches) in DIR")
    args = ap.parse_args()
    work = Path(args.keep_logs or tempfile.mkdtemp(prefix="jaxchat-startup-"))
    work.mkdir(parents=True, exist_ok=True)
    roots = {"this": ROOT} if args.against is None else {"this": ROOT, "other": Path(args.against).resolve()}
    # side by side, each checkout has its own converted-weights cache (the formats may differ)
    assets = {name: own_cache(work, name) if args.against is not None else None for name in roots}
    try:
        for run in range(args.runs):
            times = {}
            for name, root in roots.items():
                cache = work / f"cache-{name}-{run}"
                if args.clear_weights and assets[name] is not None:
                    shutil.rmtree(assets[name] / "dequantized", ignore_errors=True)
                elif args.clear_weights:
                    clear_dequantized(args.model)
                elif args.model is None:
                    prepare_assets(root, assets[name])
                label = "" if args.against is None else f" [{name}: {root}]"
                for kind in ("cold", "warm"):
                    got = time_to_first_call(args, cache, work / f"{kind}-{name}-{run}.log", root, assets[name])
                    times[name, kind] = got["first_call"]
                    print(f"run {run + 1}{label}: {kind} first tool call {got['first_call']:6.1f} s (/health "
                          f"{got['health']:6.1f} s) [{got['warmup']}] {got['call']}", flush=True)
            if args.against is not None:
                print(f"run {run + 1}: this / other, time to the first tool call: cold "
                      f"{times['this', 'cold'] / times['other', 'cold']:.2f}, warm "
                      f"{times['this', 'warm'] / times['other', 'warm']:.2f}", flush=True)
    finally:
        if args.keep_logs is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
