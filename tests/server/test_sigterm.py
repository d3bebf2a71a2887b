"""SIGTERM: in-flight streams finish or end with a clean error event within the grace period; exit 0."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.helpers import chat, sse_events

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_drains_streams_and_exits_zero():
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.server.serve_fake", "--port", str(port), "--grace", "1", "--slow-delay", "0.05"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, "server did not start"
            time.sleep(0.05)
        results: dict[str, str] = {}

        def stream(name: str, text: str) -> None:
            body = chat(messages=[{"role": "user", "content": text}], stream=True)
            results[name] = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30).text

        long_one = threading.Thread(target=stream, args=("long", "SLOW " + "w " * 400))  # ~20 s of chunks
        short_one = threading.Thread(target=stream, args=("short", "SLOW a b"))  # ~1 s of chunks
        long_one.start()
        short_one.start()
        time.sleep(0.3)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        long_one.join(15)
        short_one.join(15)
        code = proc.wait(timeout=15)
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    output = proc.stdout.read()
    assert code == 0, output
    assert "serve returned" in output
    assert elapsed < 8, elapsed
    short = sse_events(results["short"])
    assert short[-1] == "[DONE]" and short[-2]["choices"][0]["finish_reason"] == "stop"  # finished within grace
    long = sse_events(results["long"])
    assert long[-1] == "[DONE]" and long[-2]["error"]["code"] == "server_shutdown"


@pytest.mark.timeout(20)
def test_sigterm_while_the_main_thread_holds_the_drain_lock_does_not_deadlock():
    """uvicorn handles SIGTERM with `signal.signal`, so its handler (`Drain.begin`) can run on the main thread
    between two bytecodes of `listen` / `unlisten` while that thread holds the drain's lock."""
    import os

    from jaxchat.server.sse import Drain

    drain = Drain()
    previous = signal.signal(signal.SIGUSR1, lambda *_: drain.begin(60.0))
    try:
        with drain._lock:  # as `unlisten` holds it when the signal lands
            os.kill(os.getpid(), signal.SIGUSR1)
            for _ in range(1000):  # the handler runs here, between these bytecodes
                if drain.draining:
                    break
                time.sleep(0.001)
        assert drain.draining
    finally:
        signal.signal(signal.SIGUSR1, previous)
