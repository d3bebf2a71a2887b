"""Against a live uvicorn on 127.0.0.1: disconnects free the request, auth covers streams, limits hold."""

from __future__ import annotations

import json
import socket
import time

import httpx

from tests.server.conftest import API_KEY
from tests.server.helpers import assert_error, chat


def _wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def _metric(base_url: str, name: str) -> float:
    text = httpx.get(f"{base_url}/metrics").text
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(name + " "))


def test_disconnect_mid_stream_aborts(live):
    svc = live.service
    aborted, disconnects = len(svc.aborted), _metric(live.base_url, "jaxchat_stream_disconnects_total")
    slow = chat(messages=[{"role": "user", "content": "SLOW " + "word " * 300}], stream=True)
    with httpx.Client(timeout=10) as c, c.stream("POST", f"{live.base_url}/v1/chat/completions", json=slow) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: {") for line in got)
        assert svc.active  # generating
    started = time.monotonic()
    assert _wait_for(lambda: len(svc.aborted) == aborted + 1 and not svc.active), (svc.aborted, svc.active)
    assert time.monotonic() - started < 1.0  # promptly, long before the stream would have ended
    assert _wait_for(lambda: _metric(live.base_url, "jaxchat_stream_disconnects_total") == disconnects + 1)
    assert _metric(live.base_url, "jaxchat_streams_active") == 0


def _raw_request(port: int, body: dict) -> socket.socket:
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )
    return sock


def test_disconnect_while_waiting_for_first_chunk_aborts(live):
    svc = live.service
    for stream in (True, False):
        aborted = len(svc.aborted)
        sock = _raw_request(live.port, chat(messages=[{"role": "user", "content": "HANG"}], stream=stream))
        assert _wait_for(lambda: svc.active)
        sock.close()
        assert _wait_for(lambda: len(svc.aborted) == aborted + 1 and not svc.active), (stream, svc.aborted)  # noqa: B023


def test_stream_completes_and_other_streams_unaffected(live):
    svc = live.service
    done = len(svc.completed)
    r = httpx.post(f"{live.base_url}/v1/chat/completions", json=chat(stream=True), timeout=10)
    assert r.text.endswith("data: [DONE]\n\n") and len(svc.completed) == done + 1


def test_live_auth_and_body_limit(live_keyed):
    url = f"{live_keyed.base_url}/v1/chat/completions"
    with httpx.Client(timeout=10) as c:
        assert_error(c.post(url, json=chat(stream=True)), 401, None, "authentication_error")
        assert_error(c.post(url, json=chat(stream=True), headers={"Authorization": "Bearer x"}), 401)
        ok = {"Authorization": f"Bearer {API_KEY}"}
        with c.stream("POST", url, json=chat(stream=True), headers=ok) as r:
            assert r.status_code == 200
            assert "data: [DONE]" in list(r.iter_lines())
        assert c.get(f"{live_keyed.base_url}/health").status_code == 200
        big = chat(messages=[{"role": "user", "content": "x" * 100_000}])
        err = assert_error(c.post(url, json=big, headers=ok), 413, None)
        assert "65536" in err["message"]
