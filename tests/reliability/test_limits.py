"""4. Limits, on a live server with the REAL pipeline (context 1,024 tokens).

jaxchat's choice, documented in docs/reliability.md: `max_tokens` larger than the whole context is refused
with a 400 naming `max_tokens` (as vLLM does); a `max_tokens` that fits the context but not the room left
after the prompt is clipped to that room and the completion ends with finish_reason "length" (as llama.cpp's
server does; vLLM refuses it). A prompt that fills the context is a 400 naming `messages` / `prompt`.
Body size (413), message count, tool count, `n`, stop strings, `top_logprobs` and schema depth are
bounded; a request just inside each bound is accepted.
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

from jaxchat.api import Limits, parse_chat_request
from tests.reliability.support import check_error_body, leaked_slots, report, user, wait_idle

TIGHT = Limits(max_body_bytes=64 * 1024, max_messages=8, max_tools=4, max_n=2, max_stop=2)


def deep_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def tool(name: str, params: dict | None = None) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": params or {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def tight(real_service):
    from tests.server.conftest import Live

    with Live(real_service, limits=TIGHT) as server:
        yield server


def test_max_tokens_beyond_context_refused_and_prompt_room_clipped(real_service, live_real, idle_engine):
    url = live_real.base_url + "/v1/chat/completions"
    ctx = real_service.max_context
    counts: Counter = Counter()

    def post(body: dict) -> httpx.Response:
        r = httpx.post(url, json=body, timeout=120)
        counts["sent"] += 1
        counts[f"{r.status_code // 100}xx"] += 1
        return r

    over = post({"messages": user("hi"), "max_tokens": ctx + 1})
    assert over.status_code == 400 and check_error_body(over.json())["param"] == "max_tokens"
    over2 = post({"messages": user("hi"), "max_completion_tokens": 10**9, "stream": True})
    assert over2.status_code == 400 and check_error_body(over2.json())["param"] == "max_completion_tokens"
    # a prompt near the end of the context: max_tokens fits the context but not the room left -> clipped
    body = {"messages": user("word " * 990), "max_tokens": 500, "temperature": 0}
    prompt_len = len(real_service.prepare_chat(parse_chat_request(body)).prompt_ids)
    assert ctx - 40 < prompt_len < ctx, prompt_len
    clipped = post(body)
    assert clipped.status_code == 200, clipped.text
    data = clipped.json()
    counts["completed"] += 1
    assert data["choices"][0]["finish_reason"] == "length"
    assert data["usage"]["completion_tokens"] == ctx - prompt_len
    # a prompt that fills the context
    full = post({"messages": user("word " * 1100)})
    assert full.status_code == 400 and check_error_body(full.json())["param"] == "messages"
    r = httpx.post(live_real.base_url + "/v1/completions", json={"prompt": "word " * 1100}, timeout=60)
    counts["sent"] += 1
    counts["4xx"] += r.status_code // 100 == 4
    assert r.status_code == 400 and check_error_body(r.json())["param"] == "prompt"
    stats = wait_idle(real_service.engine)
    report("max_tokens/prompt limits", counts, prompt_len=prompt_len, clipped_to=ctx - prompt_len,
           leaked_slots=leaked_slots(stats))
    assert leaked_slots(stats) == 0


def test_request_bounds_hold(real_service, tight, idle_engine):
    url = tight.base_url + "/v1/chat/completions"
    ok = {"messages": user("hi"), "max_tokens": 2, "temperature": 0}
    cases = [
        # (name, body or raw bytes, expected status, expected param)
        ("body size", b'{"messages": [{"role": "user", "content": "' + b"x" * (64 * 1024) + b'"}]}', 413, None),
        ("message count", {**ok, "messages": user("hi") * 9}, 400, "messages"),
        ("tool count", {**ok, "tools": [tool(f"t{i}") for i in range(5)]}, 400, "tools"),
        ("n", {**ok, "n": 3}, 400, "n"),
        ("stop count", {**ok, "stop": ["a", "b", "c"]}, 400, "stop"),
        ("top_logprobs", {**ok, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
        ("tool schema depth", {**ok, "tools": [tool("deep", deep_schema(66))]}, 400, "ANY"),
        ("response schema depth", {**ok, "response_format": {"type": "json_schema", "json_schema": {
            "name": "s", "schema": deep_schema(66)}}}, 400, "ANY"),
    ]
    inside = [
        ("8 messages", {**ok, "messages": user("hi") * 8}),
        ("4 tools", {**ok, "tools": [tool(f"t{i}") for i in range(4)]}),
        ("n=2", {**ok, "n": 2}),
        ("2 stops", {**ok, "stop": ["a", "b"]}),
        ("schema depth 6", {**ok, "response_format": {"type": "json_schema", "json_schema": {
            "name": "s", "schema": deep_schema(6)}}}),
    ]
    counts: Counter = Counter()
    with httpx.Client(timeout=120) as client:
        for name, body, status, param in cases:
            for stream in (False, True):
                if isinstance(body, bytes):
                    r = client.post(url, content=body, headers={"content-type": "application/json"})
                else:
                    r = client.post(url, json={**body, "stream": stream})
                counts["sent"] += 1
                counts[f"{r.status_code // 100}xx"] += 1
                assert r.status_code == status, (name, r.status_code, r.text[:300])
                err = check_error_body(r.json(), name)
                assert param == "ANY" or err["param"] == param, (name, err)
        # a chunked body (no Content-Length) cannot get past the size limit either
        chunks = (b"x" * 8192 for _ in range(10))
        r = client.post(url, content=chunks, headers={"content-type": "application/json"})
        counts["sent"] += 1
        counts[f"{r.status_code // 100}xx"] += 1
        assert r.status_code == 413 and check_error_body(r.json())
        for name, body in inside:
            r = client.post(url, json=body)
            counts["sent"] += 1
            counts[f"{r.status_code // 100}xx"] += 1
            assert r.status_code == 200, (name, r.text[:300])
            counts["completed"] += 1
    stats = wait_idle(real_service.engine)
    report("request bounds", counts, leaked_slots=leaked_slots(stats))
    assert counts["5xx"] == 0 and leaked_slots(stats) == 0
