"""3. Faults, SIGTERM: a real `jaxchat serve --model <tiny checkpoint>` in a subprocess (started at collection
time by conftest.py so that its warmup overlaps the other tests).

With two streams in flight, SIGTERM makes the server stop taking new work (503 or connection refused),
lets the in-flight streams finish (or end with a `server_shutdown` error event) and then [DONE], and the
process exits 0 within a bounded time. Before the signal, the test checks in /proc/net/tcp that the
server, started without --host, listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import Counter

import httpx

from tests.reliability.support import check_error_body, report, stream_chat, user

GRACE_S = 10.0  # Limits().shutdown_grace_s, what `jaxchat serve` uses
EXIT_BOUND_S = GRACE_S + 10.0


def _listening_addresses(port: int) -> set[str]:
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state = fields[1], fields[3]
            addr, _, hexport = local.rpartition(":")
            if int(hexport, 16) == port and state == "0A":  # LISTEN
                found.add(addr)
    return found


def test_sigterm_finishes_in_flight_and_exits_zero(serve_process):
    server = serve_process
    server.wait_ready()
    assert _listening_addresses(server.port) == {"0100007F"}, _listening_addresses(server.port)  # 127.0.0.1
    url = server.base_url
    short = {"messages": user("short one"), "max_tokens": 8, "temperature": 0}
    long = {"messages": user("long one"), "max_tokens": 200, "ignore_eos": True, "temperature": 0.7, "seed": 1}
    timing: dict[str, float] = {}

    async def main():
        async with httpx.AsyncClient() as http:
            tasks = [asyncio.ensure_future(stream_chat(http, url, b, timeout=60)) for b in (short, long)]
            deadline = time.monotonic() + 60
            while server.proc.poll() is None and time.monotonic() < deadline:  # both admitted and streaming?
                s = (await http.get(url + "/metrics", timeout=5)).text
                if any(line.startswith("jaxchat_requests_running 2") for line in s.splitlines()):
                    break
                await asyncio.sleep(0.05)
            timing["signal"] = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            try:  # new work is refused while draining (or the socket is already closed)
                late = await http.post(url + "/v1/chat/completions", json=short, timeout=10)
                late_status = late.status_code
                if late_status != 200:
                    check_error_body(late.json(), "after SIGTERM")
            except httpx.TransportError:
                late_status = "refused"
            results = await asyncio.gather(*tasks)
            timing["streams_done"] = time.monotonic()
            return results, late_status

    try:
        (res_short, res_long), late_status = asyncio.run(main())
        code = server.proc.wait(timeout=EXIT_BOUND_S + 10)
        exited = time.monotonic() - timing["signal"]
    finally:
        output = server.output()
    counts = Counter(sent=3, completed=sum(r.finish_reason is not None and r.error is None for r in (res_short, res_long)))
    report("sigterm", counts, exit_code=code, exit_s=round(exited, 2), late_request=late_status,
           short=(res_short.finish_reason, res_short.error and res_short.error.get("code")),
           long=(res_long.finish_reason, res_long.error and res_long.error.get("code")))
    assert code == 0, output[-3000:]
    assert exited < EXIT_BOUND_S, exited
    assert late_status in (503, "refused"), late_status
    for res in (res_short, res_long):
        assert res.status == 200 and res.done, res  # every stream ends with [DONE]
        if res.error is None:
            assert res.finish_reason in ("stop", "length"), res
        else:
            assert check_error_body({"error": res.error})["code"] == "server_shutdown", res
    assert res_short.finish_reason is not None  # a short request finishes within the grace period
    assert "Traceback" not in output, output[-3000:]
