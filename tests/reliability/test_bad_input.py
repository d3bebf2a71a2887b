"""1. Bad input, fuzzed: >= 1,000 malformed requests to a LIVE uvicorn on 127.0.0.1 backed by the REAL pipeline.

The generators are the server fuzzer's (`tests.server.test_fuzz.malformed`: raw bytes, truncated JSON,
invalid UTF-8, wrong content types, deep nesting of bodies and JSON schemas, oversized bodies and
message lists, wrong types and absurd numbers in every field, invalid tool names, unknown roles, unknown
models), retargeted at the real model's id, plus cases only a real model can judge: prompts over the
context, huge strings, absurd `top_logprobs`, tool schemas of the wrong type. Every answer must be a 4xx
with the OpenAI error body (no internals), never a 5xx, never a hang; afterwards `/health` is ok and
the engine has nothing running and every slot free.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.reliability.support import check_error_body, leaked_slots, report, wait_idle
from tests.server.test_fuzz import LIMITS, malformed

FAKE = b'"fake-model"'
USER = {"role": "user", "content": "hello"}


@st.composite
def real_only(draw, model: str) -> tuple[str, str, bytes, dict]:
    """Malformed requests whose rejection needs the real service (tokenizer, context, template)."""
    kind = draw(st.sampled_from(["over_context", "huge_string", "top_logprobs", "tool_schema", "n_absurd",
                                 "unknown_model", "empty_messages"]))
    stream = draw(st.booleans())
    base = {"model": model, "messages": [USER], "stream": stream}
    path = "/v1/chat/completions"
    if kind == "over_context":  # fits the body limit, not the 1,024-token context
        words = draw(st.integers(1100, 4000))
        if draw(st.booleans()):
            body = {**base, "messages": [{"role": "user", "content": "lorem " * words}]}
        else:
            path, body = "/v1/completions", {"model": model, "prompt": "lorem " * words, "stream": stream}
    elif kind == "huge_string":  # huge strings where names or enums belong
        s = "x" * draw(st.integers(65, 200_000))
        body = draw(st.sampled_from([
            {**base, "tools": [{"type": "function", "function": {"name": s}}]},
            {**base, "tool_choice": {"type": "function", "function": {"name": s}}},
            {**base, "messages": [{"role": s[:100_000], "content": "hi"}]},
            {**base, "reasoning_effort": s},
            {**base, "response_format": {"type": s}},
        ]))
    elif kind == "top_logprobs":
        value = draw(st.one_of(st.integers(max_value=-1), st.integers(min_value=21, max_value=10**30),
                               st.text(max_size=5), st.floats(allow_nan=False, allow_infinity=False)))
        body = {**base, "logprobs": True, "top_logprobs": value}
    elif kind == "tool_schema":
        params = draw(st.one_of(st.integers(), st.text(max_size=10), st.lists(st.integers(), max_size=3),
                                st.just({"type": "object", "properties": []}),
                                st.just({"type": "object", "required": "x"})))
        body = {**base, "tools": [{"type": "function", "function": {"name": "f", "parameters": params}}]}
    elif kind == "n_absurd":
        body = {**base, "n": draw(st.one_of(st.integers(max_value=0), st.integers(min_value=17, max_value=10**30)))}
    elif kind == "unknown_model":
        body = {**base, "model": draw(st.text(min_size=1, max_size=50).filter(lambda m: m != model))}
    else:
        body = {**base, "messages": draw(st.sampled_from([[], {}, None, "hi"]))}
    return path, kind, json.dumps(body).encode(), {"content-type": "application/json"}


def test_fuzzed_bad_input_live_real_service(real_service, idle_engine):
    from tests.server.conftest import Live

    model = real_service.model_id.encode()
    counts: Counter = Counter()
    kinds: Counter = Counter()
    slowest = [0.0]
    cases = st.one_of(
        malformed().map(lambda c: (c[0], c[1], c[2].replace(FAKE, json.dumps(model.decode()).encode()), c[3])),
        real_only(model.decode()),
    )
    started = time.monotonic()
    with Live(real_service, limits=LIMITS) as live, httpx.Client(base_url=live.base_url, timeout=30) as client:

        @settings(max_examples=1150, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(cases)
        def run(case):
            path, kind, body, headers = case
            t0 = time.monotonic()
            r = client.post(path, content=body, headers=headers)  # a hang is an httpx timeout: a failure
            slowest[0] = max(slowest[0], time.monotonic() - t0)
            counts["sent"] += 1
            kinds[kind] += 1
            counts[f"{r.status_code // 100}xx"] += 1
            assert 400 <= r.status_code < 500, (kind, body[:300], r.status_code, r.text[:300])
            assert r.headers["content-type"].startswith("application/json"), (kind, r.headers)
            check_error_body(r.json(), kind)

        run()
        health = client.get("/health")
    stats = wait_idle(real_service.engine, timeout=5)
    report("bad input", counts, leaked_slots=leaked_slots(stats), running=stats.running,
           waiting=stats.waiting, slowest_s=round(slowest[0], 2), seconds=round(time.monotonic() - started, 1),
           by_kind=dict(kinds))
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert counts["sent"] >= 1000 and counts["5xx"] == 0 and counts["4xx"] == counts["sent"]
    assert stats.running == 0 and stats.waiting == 0 and leaked_slots(stats) == 0
    assert stats.compiles_on_request_path == 0


# ---- malformed JSON schemas: a 4xx, never a 500 (a 500 makes the openai SDK retry) ------------------------
SCHEMA_KEYWORDS = ["type", "properties", "items", "required", "enum", "minLength", "maximum", "pattern", "anyOf",
                   "allOf", "$ref", "additionalProperties", "const", "minItems", "format"]
any_json = st.recursive(
    st.one_of(st.booleans(), st.integers(-5, 5), st.text(max_size=6), st.none()),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.sampled_from(SCHEMA_KEYWORDS + ["a"]), inner,
                                                                max_size=2),
    max_leaves=4,
)


@st.composite
def schema_bodies(draw) -> dict:
    schema = {"type": "object", "properties": {"a": {draw(st.sampled_from(SCHEMA_KEYWORDS)): draw(any_json)}}}
    if draw(st.booleans()):
        schema = {draw(st.sampled_from(SCHEMA_KEYWORDS)): draw(any_json)}
    body = {"messages": [USER], "max_tokens": 1, "temperature": 0, "stream": draw(st.booleans())}
    if draw(st.booleans()):
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    else:
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": schema}}}}]
        body["tool_choice"] = draw(st.sampled_from(["auto", "required"]))
    return body


def test_malformed_json_schema_contents_are_4xx_not_500(real_service, live_real, idle_engine):
    """Schemas with wrong types inside (`{"type": "object", "properties": 5}`, `{"type": "strnig"}`,
    `{"pattern": "("}`, ...) in `response_format` or in tool parameters: a 400 naming the field, or accepted;
    never a 500. Minimal reproducer: POST /v1/chat/completions {"messages": [{"role": "user", "content": "x"}],
    "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "strnig"}}}}."""
    counts: Counter = Counter()
    fivehundreds: list = []
    fixed = [{"type": "object", "properties": 5}, {"type": "strnig"}, {"pattern": "(", "type": "string"},
             {"type": "object", "properties": {"a": 5}}, {"enum": 5}]
    bodies = [{"messages": [USER], "max_tokens": 1, "response_format": {
        "type": "json_schema", "json_schema": {"name": "s", "schema": s}}} for s in fixed]
    with httpx.Client(base_url=live_real.base_url, timeout=60) as client:

        def send(body: dict) -> None:
            r = client.post("/v1/chat/completions", json=body)
            counts["sent"] += 1
            counts[f"{r.status_code // 100}xx"] += 1
            if r.status_code >= 500:
                fivehundreds.append(json.dumps(body)[:200])
            elif r.status_code != 200:
                check_error_body(r.json(), "schema")

        for body in bodies:
            send(body)

        @settings(max_examples=120, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(schema_bodies())
        def run(body):
            send(body)

        run()
    stats = wait_idle(real_service.engine)
    report("malformed schemas", counts, leaked_slots=leaked_slots(stats), examples_500=fivehundreds[:3])
    assert leaked_slots(stats) == 0
    assert counts["5xx"] == 0, f"{counts['5xx']} schemas answered 500, e.g. {fivehundreds[:5]}"
