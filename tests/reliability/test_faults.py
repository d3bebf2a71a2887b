"""3. Faults, against a live server on the REAL pipeline (SIGTERM is in test_sigterm.py).

- 20 clients disconnect mid-stream: each one's slot is free within two engine steps of its abort, and
  the concurrent greedy streams produce exactly what they produce alone.
- A grammar that rejects a token (`GrammarConstraint.inject_rejection()` on one request's constraint,
  through a wrapped `GrammarEngine.make`): that request completes with masking given up and the log line
  `Constrained decoding disabled for this request: ...`; the other constrained requests stay valid.
- NaN logits for one row (the forward hook in conftest.py, by position): that row still gets allowed
  tokens (its json_schema output is valid), the other rows' outputs equal their solo runs.
- An exception while processing one request (the parser, or the engine's detokeniser): that request ends
  with an error of its own (a 500 body, or an `error` chunk then [DONE]); the others continue unaffected.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter

import httpx
import pytest

from jaxchat.api import parse_chat_request
from tests.reliability.conftest import NAN_POSITIONS
from tests.reliability.support import (
    TIME,
    WEATHER,
    call_ok,
    check_error_body,
    json_schema_format,
    leaked_slots,
    post_chat,
    report,
    schema_ok,
    solo,
    stream_chat,
    user,
    wait_idle,
)

G = {"temperature": 0, "frequency_penalty": 1.5}


def bystanders(n: int = 4, max_tokens: int = 24) -> list[dict]:
    return [{"messages": user(f"Bystander {i}: tell me about the number {i}"), "max_tokens": max_tokens, **G}
            for i in range(n)]


async def run_all(url: str, bodies: list[dict], **kw) -> list:
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as http:
        return await asyncio.gather(*(stream_chat(http, url, b, timeout=300, **kw) for b in bodies))


def completed(res) -> bool:
    return res.status == 200 and res.done and res.finish_reason is not None and res.error is None


# ---- disconnects -------------------------------------------------------------------------------------
def test_20_clients_disconnect_mid_stream(real_service, live_real, idle_engine, monkeypatch):
    engine, sched, url = real_service.engine, real_service.engine.scheduler, live_real.base_url
    others = bystanders(4, 40)
    refs = [solo(url, b) for b in others]
    aborted: dict[str, tuple[int, float]] = {}  # request id -> (engine step, time) when abort was called
    freed: dict[str, tuple[int, float]] = {}
    real_abort = engine.abort

    def abort(request_id: str) -> None:
        aborted.setdefault(request_id, (sched.steps, time.monotonic()))
        real_abort(request_id)

    monkeypatch.setattr(engine, "abort", abort)
    stop = threading.Event()

    def watch() -> None:  # when does each aborted request leave the slots and the queues?
        while not stop.is_set():
            live = {s.req.request_id for s in list(sched.running) if not s.finished}
            live |= {s.req.request_id for s in list(sched.waiting)} | set(sched.inbox.request_ids())
            for rid in list(aborted):
                if rid not in live and rid not in freed:
                    freed[rid] = (sched.steps, time.monotonic())
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    leavers = [{"messages": user(f"Leaver {i}: write a very long essay"), "max_tokens": 600, "ignore_eos": True,
                "temperature": 0.8, "seed": i} for i in range(20)]
    closed_at: list[float] = []

    async def leave(http: httpx.AsyncClient, body: dict):
        res = await stream_chat(http, url, body, stop_after_chunks=3, timeout=300)  # role chunk + 2 deltas
        closed_at.append(time.monotonic())
        return res

    async def main():
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as http:
            stay = [asyncio.ensure_future(stream_chat(http, url, b, timeout=300)) for b in others]
            gone = await asyncio.gather(*(leave(http, b) for b in leavers))
            return gone, await asyncio.gather(*stay)

    t0 = time.monotonic()
    gone, stayed = asyncio.run(main())
    stats = wait_idle(engine, timeout=10)
    time.sleep(0.05)
    stop.set()
    watcher.join(2)
    step_lag = [freed[r][0] - aborted[r][0] for r in aborted if r in freed]
    time_lag = [freed[r][1] - aborted[r][1] for r in aborted if r in freed]
    counts = Counter(sent=len(leavers) + len(others), completed=sum(map(completed, stayed)))
    for res in [*gone, *stayed]:
        counts[f"{res.status // 100}xx"] += 1
    report("disconnects", counts, disconnected=len(gone), aborted=len(aborted), freed=len(freed),
           max_steps_to_free=max(step_lag, default=None), max_s_to_free=round(max(time_lag, default=0), 3),
           leaked_slots=leaked_slots(stats), seconds=round(time.monotonic() - t0, 1))
    assert all(r.status == 200 and not r.done for r in gone)  # they really left mid-stream
    assert len(aborted) == len(leavers) and set(freed) == set(aborted)
    assert max(step_lag) <= 2, step_lag  # free within two engine steps of the abort
    assert max(time_lag) < 2.0, time_lag
    assert [r.key() for r in stayed] == [r.key() for r in refs] and all(map(completed, stayed))
    assert stats.running == 0 and stats.waiting == 0 and leaked_slots(stats) == 0


# ---- a grammar that rejects a token ------------------------------------------------------------------
def test_grammar_rejection_gives_up_masking_for_that_request_only(real_service, live_real, idle_engine,
                                                                  monkeypatch, caplog):
    grammar = real_service.grammar
    made = grammar.make
    injected = []

    def make(spec, request, *args, **kwargs):
        constraint = made(spec, request, *args, **kwargs)
        if getattr(request, "json_schema_name", None) == "inject_reject":
            constraint.inject_rejection()
            injected.append(constraint)
        return constraint

    monkeypatch.setattr(grammar, "make", make)
    target = {"messages": user("Give a verdict"), "response_format": json_schema_format("inject_reject"),
              "max_tokens": 24, "temperature": 0}
    others = [
        {"messages": user(f"Give verdict {i}"), "response_format": json_schema_format(), "max_tokens": 64,
         "temperature": 0} for i in range(3)
    ] + [
        {"messages": user(f"Weather {i}?"), "tools": [WEATHER, TIME], "tool_choice": "required", "max_tokens": 64,
         "temperature": 0} for i in range(2)
    ]
    with caplog.at_level(logging.WARNING, logger="jaxchat"):
        results = asyncio.run(run_all(live_real.base_url, [target, *others]))
    stats = wait_idle(real_service.engine)
    lines = [r.getMessage() for r in caplog.records if "Constrained decoding disabled for this request" in r.getMessage()]
    res, rest = results[0], results[1:]
    counts = Counter(sent=len(results), completed=sum(map(completed, results)))
    report("grammar rejection", counts, given_up=len(lines), target_finish=res.finish_reason,
           target_error=res.error, others_valid=sum(
               schema_ok(r.content) if i < 3 else all(call_ok(c) for c in r.tool_calls) and bool(r.tool_calls)
               for i, r in enumerate(rest)), leaked_slots=leaked_slots(stats))
    assert len(injected) == 1 and injected[0].disabled
    assert len(lines) == 1 and "injected by a test" in lines[0], lines
    # the request itself completes (masking off from then on), it does not end with an error
    assert completed(res), (res.finish_reason, res.error)
    for r in rest[:3]:
        assert completed(r) and r.finish_reason == "stop" and schema_ok(r.content), r
    for r in rest[3:]:
        assert completed(r) and r.finish_reason == "tool_calls" and all(call_ok(c) for c in r.tool_calls), r
    assert leaked_slots(stats) == 0


# ---- NaN logits for one row --------------------------------------------------------------------------
def _padded_to(service, body: dict, prompt_len: int) -> dict:
    """`body` with its user message padded so that its prompt is exactly `prompt_len` tokens."""
    lo, hi = 0, prompt_len
    while lo < hi:  # the largest number of filler words that still fits
        mid = (lo + hi + 1) // 2
        b = {**body, "messages": user("Verdict on this: " + " ok" * mid)}
        if len(service.prepare_chat(parse_chat_request({**b, "stream": True})).prompt_ids) <= prompt_len:
            lo = mid
        else:
            hi = mid - 1
    b = {**body, "messages": user("Verdict on this: " + " ok" * lo)}
    n = len(service.prepare_chat(parse_chat_request({**b, "stream": True})).prompt_ids)
    for extra in ("", "!", "!!", "!!!", " !", "?", "??"):
        c = {**body, "messages": user("Verdict on this: " + " ok" * lo + extra)}
        if len(service.prepare_chat(parse_chat_request({**c, "stream": True})).prompt_ids) == prompt_len:
            return c
    pytest.fail(f"could not pad the prompt to {prompt_len} tokens (got {n})")


def test_nan_logits_for_one_row(real_service, live_real, idle_engine):
    lo, hi = NAN_POSITIONS
    prompt_len = lo - 2  # generated tokens 3.. are sampled from all-NaN logits
    target = _padded_to(real_service, {"response_format": json_schema_format(), "max_tokens": 80,
                                       "temperature": 0, "stream_options": {"include_usage": True}}, prompt_len)
    others = bystanders(4, 48)
    refs = [solo(live_real.base_url, b) for b in others]
    steps0 = real_service.engine.stats().steps
    results = asyncio.run(run_all(live_real.base_url, [target, *others]))
    stats = wait_idle(real_service.engine)
    res, rest = results[0], results[1:]
    nan_tokens = max(0, min(hi, prompt_len + (res.usage or {}).get("completion_tokens", 0)) - lo)
    counts = Counter(sent=len(results), completed=sum(map(completed, results)))
    report("nan row", counts, nan_sampled_tokens=nan_tokens, target_valid=schema_ok(res.content),
           others_equal_solo=sum(r.key() == f.key() for r, f in zip(rest, refs)),
           steps=stats.steps - steps0, leaked_slots=leaked_slots(stats))
    assert res.usage["prompt_tokens"] == prompt_len
    assert nan_tokens >= 5, res.usage  # the row really sampled from NaN logits several times
    assert completed(res) and res.finish_reason == "stop" and schema_ok(res.content), res
    assert [r.key() for r in rest] == [r.key() for r in refs]
    assert leaked_slots(stats) == 0


# ---- an exception while processing one request -------------------------------------------------------
BOMB_TOOL = {"type": "function", "function": {"name": "parser_bomb", "parameters": {"type": "object", "properties": {}}}}


def _arm_parser_bomb(monkeypatch) -> None:
    """The parser raises for requests that carry the `parser_bomb` tool (streamed and not)."""
    import jaxchat.api.chat_run as chat_run_mod
    import jaxchat.api.pipeline as pipeline_mod

    def armed(options) -> bool:
        return any(t.get("function", {}).get("name") == "parser_bomb" for t in options.tools)

    class BombStream(chat_run_mod.ChatStream):
        def __init__(self, spec, options):
            super().__init__(spec, options)
            self._armed, self._calls = armed(options), 0

        def update(self, text, is_final):
            self._calls += 1
            if self._armed and self._calls > 2:
                raise RuntimeError("injected parser failure")
            return super().update(text, is_final)

    real_parse = pipeline_mod.chat_parse

    def bomb_parse(spec, text, is_partial, options=None, *a, **kw):
        if options is not None and armed(options):
            raise RuntimeError("injected parser failure")
        return real_parse(spec, text, is_partial, options, *a, **kw)

    monkeypatch.setattr(chat_run_mod, "ChatStream", BombStream)
    monkeypatch.setattr(pipeline_mod, "chat_parse", bomb_parse)


def _arm_detok_bomb(monkeypatch, message: str = "injected detokenizer failure") -> None:
    """The engine's detokeniser raises on the 3rd token of requests whose prompt says DETOKBOMB."""
    import jaxchat.engine.tokens as sched_mod

    class BombDetok(sched_mod.IncrementalDetokenizer):
        def __init__(self, tokenizer, prompt_ids=()):
            super().__init__(tokenizer, prompt_ids)
            self._armed = "DETOKBOMB" in tokenizer.decode(list(prompt_ids))
            self._n = 0

        def add(self, token_id):
            self._n += 1
            if self._armed and self._n >= 3:
                raise ValueError(message)
            return super().add(token_id)

    monkeypatch.setattr(sched_mod, "IncrementalDetokenizer", BombDetok)


@pytest.mark.parametrize("where", ["parser", "detokenizer"])
def test_exception_in_one_request_ends_only_that_request(where, real_service, live_real, idle_engine, monkeypatch):
    url = live_real.base_url
    others = bystanders(4, 32)
    refs = [solo(url, b) for b in others]
    if where == "parser":
        _arm_parser_bomb(monkeypatch)
        bomb = {"messages": user("Hello"), "tools": [BOMB_TOOL], "max_tokens": 24, **G}
    else:
        _arm_detok_bomb(monkeypatch)
        bomb = {"messages": user("DETOKBOMB hello"), "max_tokens": 24, **G}

    async def main():
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=64)) as http:
            stay = [asyncio.ensure_future(stream_chat(http, url, b, timeout=300)) for b in others]
            streamed = await stream_chat(http, url, bomb, timeout=300)
            plain = await http.post(url + "/v1/chat/completions", json=bomb, timeout=300)
            return streamed, plain, await asyncio.gather(*stay)

    streamed, plain, stayed = asyncio.run(main())
    stats = wait_idle(real_service.engine)
    counts = Counter(sent=2 + len(others), completed=sum(map(completed, stayed)))
    for status in [streamed.status, plain.status_code, *(r.status for r in stayed)]:
        counts[f"{status // 100}xx"] += 1
    report(f"exception in {where}", counts, stream_error=streamed.error, plain_status=plain.status_code,
           others_equal_solo=sum(r.key() == f.key() for r, f in zip(stayed, refs)), leaked_slots=leaked_slots(stats))
    # streamed: 200, then an error chunk of its own, then [DONE]
    assert streamed.status == 200 and streamed.error is not None and streamed.done, streamed
    check_error_body({"error": streamed.error}, f"{where} stream")
    # not streamed: a generic 500 body
    assert plain.status_code == 500, plain.text
    check_error_body(plain.json(), f"{where} plain")
    # the others are unaffected
    assert [r.key() for r in stayed] == [r.key() for r in refs] and all(map(completed, stayed))
    assert stats.running == 0 and leaked_slots(stats) == 0
    assert post_chat(url, {**others[0], "stream": False}).status_code == 200  # still serving
