"""Start-up benchmark: `jaxchat serve` from launch to a ready /health, cold (a fresh machine: an empty
compilation cache and, for a GGUF model, no cached dequantised weights) vs warm (the caches the cold start
filled), side by side in one run, with the ratio warm / cold.

Each start is a subprocess on a free 127.0.0.1 port with its own `--compile-cache` directory (a fresh
temporary one for the cold start, the same one again for the warm start). Each start's own log line
"Warm-up: N programs in S s (C compiled, L loaded ...)" is shown next to its time, so the share of the
start that is compiling is visible. `--runs K` repeats the cold/warm pair K times on fresh caches.

    python bench/startup.py [--model PATH] [--max-batch 8] [--max-context 4096] [--runs 1]
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def time_to_ready(args: argparse.Namespace, cache: Path, log: Path, root: Path = ROOT) -> tuple[float, str]:
    """Seconds from launching `jaxchat serve` (of the checkout at `root`) to /health answering 200, and its warm-up
    log line."""
    port = _free_port()
    cmd = [sys.executable, "-m", "jaxchat.cli", "serve", "--port", str(port), "--max-batch", str(args.max_batch),
           "--max-context", str(args.max_context), "--compile-cache", str(cache)]
    if args.model:
        cmd += ["--model", args.model]
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root)
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        seconds = time.perf_counter() - t0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    found = re.search(r"Warm-up: .*", log.read_text())
    return seconds, found.group(0) if found else "(no warm-up line)"


def clear_dequantized(model: str | None) -> None:
    """Remove the GGUF model's cached dequantised weights (`gguf_loader.dequantized_cache_file`)."""
    sys.path.insert(0, str(ROOT))
    from jaxchat.assets import DEFAULT_MODEL, asset_path
    from jaxchat.models.gguf_loader import dequantized_cache_file

    path = Path(model) if model else asset_path(DEFAULT_MODEL)
    cached = dequantized_cache_file(path) if path.suffix == ".gguf" else None
    if cached is not None:
        cached.unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="default: the default model asset")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--against", default=None, metavar="DIR", help="another checkout to start side by side")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="jaxchat-startup-"))
    roots = {"this": ROOT} if args.against is None else {"this": ROOT, "other": Path(args.against).resolve()}
    try:
        for run in range(args.runs):
            times = {}
            for name, root in roots.items():
                cache = work / f"cache-{name}-{run}"
                clear_dequantized(args.model)
                cold, cold_line = time_to_ready(args, cache, work / f"cold-{name}-{run}.log", root)
                warm, warm_line = time_to_ready(args, cache, work / f"warm-{name}-{run}.log", root)
                times[name] = (cold, warm)
                label = "" if args.against is None else f" [{name}: {root}]"
                print(f"run {run + 1}{label}: cold {cold:6.1f} s  [{cold_line}]")
                print(f"run {run + 1}{label}: warm {warm:6.1f} s  [{warm_line}]")
                print(f"run {run + 1}{label}: warm / cold = {warm / cold:.2f}")
            if args.against is not None:
                (cold, warm), (other_cold, other_warm) = times["this"], times["other"]
                print(f"run {run + 1}: this / other: cold {cold / other_cold:.2f}, warm {warm / other_warm:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
