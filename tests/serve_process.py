"""`jaxchat serve` as a subprocess for the end-to-end tests: a free port, launch, wait for /health, stop.

Contract: `free_port()` is an unused 127.0.0.1 port; `start_serve(args, log, env=None, timeout=900)` launches
`python -m jaxchat.cli serve --port P *args` (or `command` instead of `python -m jaxchat.cli`) from the repository root with this checkout on PYTHONPATH,
output to `log`, and returns (process, base URL) once GET /health answers 200; it fails the test (killing
the process) when the server exits or is not healthy in `timeout` seconds. `stop(proc)` sends SIGTERM and
waits for the exit.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(args: list[str], log: Path, env: dict | None = None, timeout: float = 900,
                command: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**(os.environ if env is None else env), "PYTHONPATH": str(ROOT)}  # this checkout's jaxchat
    with open(log, "w") as out:
        proc = subprocess.Popen([*(command or [sys.executable, "-m", "jaxchat.cli"]), "serve", "--port", str(port), *args],
                                stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, base
        except OSError:
            time.sleep(0.5)
    proc.kill()
    pytest.fail(f"server did not become healthy in {timeout:.0f} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen, timeout: float = 120) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=timeout)
