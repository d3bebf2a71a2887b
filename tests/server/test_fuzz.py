"""Hypothesis fuzzer: >= 1,000 malformed requests; every answer is a 4xx with the OpenAI error body.

Categories: raw bytes, truncated JSON, invalid UTF-8, wrong content types, deep nesting (bodies and
JSON schemas), oversized bodies and message lists, wrong types and absurd numbers in every field,
invalid tool names, unknown roles, unknown models. Each generated request is invalid by
construction; the test prints (sent, 4xx, 5xx) and requires 5xx == 0 and no request left running.
"""

from __future__ import annotations

import json
from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from jaxchat.api import Limits
from jaxchat.server import create_app
from tests.server.fake import FakeService

LIMITS = Limits(max_body_bytes=256 * 1024, max_messages=64, max_tools=16)
USER = {"role": "user", "content": "hello"}
JSON_CT = {"content-type": "application/json"}

scalars = st.one_of(
    st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
not_bool = json_values.filter(lambda v: not isinstance(v, bool))
not_int = json_values.filter(lambda v: not (isinstance(v, int) and not isinstance(v, bool)))
not_number = json_values.filter(lambda v: not (isinstance(v, (int, float)) and not isinstance(v, bool)))
not_str = json_values.filter(lambda v: not isinstance(v, str))
huge = st.integers(10**7, 10**30)


def out_of(lo: float, hi: float) -> st.SearchStrategy:
    return st.floats(max_value=lo, exclude_max=True, allow_nan=False, allow_infinity=False, width=32) | st.floats(
        min_value=hi, exclude_min=True, allow_nan=False, allow_infinity=False
    )


BAD_FIELDS = {
    "model": not_str.filter(lambda v: v is not None)
    | st.text(min_size=1, max_size=30).filter(lambda s: s != "fake-model"),
    "stream": not_bool,
    "n": not_int | st.integers(max_value=0) | st.integers(min_value=17),
    "max_tokens": not_int | st.integers(max_value=0) | huge,
    "max_completion_tokens": not_int | st.integers(max_value=0) | huge,
    "temperature": not_number | out_of(0, 2),
    "top_p": not_number | st.floats(max_value=0, allow_nan=False, allow_infinity=False) | out_of(0, 1),
    "top_k": not_int | st.integers(max_value=-2),
    "min_p": not_number | out_of(0, 1),
    "presence_penalty": not_number | out_of(-2, 2),
    "frequency_penalty": not_number | out_of(-2, 2),
    "repetition_penalty": not_number | st.floats(max_value=0, allow_nan=False, allow_infinity=False),
    "seed": not_int | st.integers(min_value=2**64) | st.integers(max_value=-(2**63) - 1),
    "logprobs": not_bool,
    "stop": not_str.filter(
        lambda v: not (isinstance(v, list) and all(isinstance(s, str) and s for s in v) and len(v) <= 4)
    ),
    "messages": st.just([])
    | not_str.filter(lambda v: not isinstance(v, list))
    | st.lists(not_str.filter(lambda v: not isinstance(v, dict)), min_size=1, max_size=3),
    "tools": st.lists(
        st.fixed_dictionaries(
            {
                "type": st.just("function"),
                "function": st.fixed_dictionaries(
                    {
                        "name": st.text(max_size=80).filter(
                            lambda s: (
                                not s
                                or len(s) > 64
                                or not s.replace("_", "a").replace("-", "a").isalnum()
                                or not s.isascii()
                            )
                        )
                    }
                ),
            }
        ),
        min_size=1,
        max_size=3,
    ),
    "tool_choice": st.text(max_size=10).filter(lambda s: s not in ("none", "auto")) | st.integers(),
    "response_format": st.fixed_dictionaries(
        {"type": st.text(max_size=10).filter(lambda s: s not in ("text", "json_object", "json_schema"))}
    ),
    "stream_options": json_values.filter(lambda v: not isinstance(v, dict)),
    "think": not_bool,
    "reasoning_effort": not_str
    | st.text(min_size=1, max_size=8).filter(
        lambda s: s not in ("none", "minimal", "low", "medium", "high", "xhigh", "max")
    ),
}

bad_messages = st.one_of(
    st.builds(
        lambda r: [{"role": r, "content": "x"}],
        st.text(max_size=12).filter(lambda r: r not in ("system", "developer", "user", "assistant", "tool")),
    ),
    st.builds(
        lambda c: [{"role": "user", "content": c}],
        not_str.filter(
            lambda v: (
                not (
                    isinstance(v, list)
                    and all(
                        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in v
                    )
                )
            )
        ),
    ),
    st.builds(lambda k: [USER] * k, st.integers(65, 200)),
    st.builds(
        lambda s: [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": s}}]}], st.text(max_size=10)
    ),
    st.builds(
        lambda tc: [USER, {"role": "assistant", "content": None, "tool_calls": tc}],
        not_str.filter(lambda v: not isinstance(v, list))
        | st.lists(not_str.filter(lambda v: not isinstance(v, dict)), min_size=1, max_size=2),
    ),
)


def deep(depth: int, kind: str) -> object:
    value: object = 1
    for _ in range(depth):
        value = [value] if kind == "list" else {"a": value}
    return value


@st.composite
def malformed(draw) -> tuple[str, str, bytes, dict]:
    path = draw(st.sampled_from(["/v1/chat/completions", "/v1/completions"]))
    kind = draw(
        st.sampled_from(
            ["bytes", "truncated", "utf8", "ctype", "nesting", "schema", "big", "prompt"]
            + ["field"] * 5
            + ["messages"] * 2
        )
    )
    base = {"model": "fake-model", "messages": [USER], "stream": draw(st.booleans())}
    if path == "/v1/completions":
        base = {"model": "fake-model", "prompt": "hi", "stream": base["stream"]}
    headers = dict(JSON_CT)
    if kind == "bytes":
        body = draw(st.binary(max_size=200).filter(lambda b: not _is_valid_request(b)))
    elif kind == "truncated":
        full = json.dumps({**base, "temperature": 0.5}).encode()
        body = full[: draw(st.integers(0, len(full) - 1))]
    elif kind == "utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80"]))
        body = json.dumps(base).encode().replace(b"hello" if b"hello" in json.dumps(base).encode() else b"hi", bad)
    elif kind == "ctype":
        headers = {
            "content-type": draw(
                st.sampled_from(
                    [
                        "text/plain",
                        "application/x-www-form-urlencoded",
                        "multipart/form-data",
                        "application/xml",
                        "application/json; charset=utf-16",
                    ]
                )
            )
        }
        body = json.dumps(base).encode()
    elif kind == "nesting":
        depth = draw(st.integers(LIMITS.max_json_depth + 1, 5000))
        opener, closer = (b"[", b"]") if draw(st.booleans()) else (b'{"a":', b"}")
        body = json.dumps(base).encode()[:-1] + b', "extra": ' + opener * depth + b"1" + closer * depth + b"}"
    elif kind == "schema":
        schema = {"type": "object", "properties": {"x": deep(draw(st.integers(64, 200)), "dict")}}
        field = draw(st.sampled_from(["tools", "response_format"]))
        extra = (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}
            if field == "tools"
            else {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}
        )
        body = json.dumps({"model": "fake-model", "messages": [USER], **extra}).encode()
        path = "/v1/chat/completions"
    elif kind == "big":
        body = json.dumps(
            {**base, "junk": "x" * draw(st.integers(LIMITS.max_body_bytes, 2 * LIMITS.max_body_bytes))}
        ).encode()
    elif kind == "field" or (kind == "messages" and path == "/v1/completions"):
        fields = dict(BAD_FIELDS)
        if path == "/v1/completions":
            for name in (
                "messages",
                "tools",
                "tool_choice",
                "response_format",
                "think",
                "reasoning_effort",
                "logprobs",
            ):
                fields.pop(name)
        name = draw(st.sampled_from(sorted(fields)))
        value = draw(fields[name])
        body = json.dumps(
            {**base, name: value} if name != "stream_options" else {**base, "stream": True, name: value}
        ).encode()
    elif kind == "messages":
        body = json.dumps({**base, "messages": draw(bad_messages)}).encode()
    else:  # prompt
        path = "/v1/completions"
        prompt = draw(
            st.one_of(
                st.just([]),
                st.lists(st.integers(max_value=-1), min_size=1, max_size=3),
                st.booleans(),
                st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                st.lists(st.text(), min_size=2, max_size=3),
            )
        )
        body = json.dumps({"model": "fake-model", "prompt": prompt}).encode()
    return path, kind, body, headers


def _is_valid_request(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except ValueError:
        return False


def test_fuzz_malformed_requests():
    service = FakeService()
    counts: Counter = Counter()
    kinds: Counter = Counter()
    with TestClient(create_app(service, limits=LIMITS), raise_server_exceptions=False) as client:

        @settings(
            max_examples=1300, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
        )
        @given(malformed())
        def run(case):
            path, kind, body, headers = case
            r = client.post(path, content=body, headers=headers)
            counts["sent"] += 1
            kinds[kind] += 1
            counts[f"{r.status_code // 100}xx"] += 1
            assert r.status_code < 500, (kind, body[:300], r.text)
            assert 400 <= r.status_code < 500, (kind, body[:300], r.status_code, r.text[:300])
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"], r.text
            assert "Traceback" not in err["message"] and "/work/" not in err["message"]

        run()
        assert client.get("/health").json() == {"status": "ok"}
    print(
        f"\nfuzz: sent={counts['sent']} 4xx={counts['4xx']} 5xx={counts['5xx']} by kind={dict(kinds)} "
        f"running={len(service.active)}"
    )
    assert counts["sent"] >= 1000 and counts["5xx"] == 0 and counts["4xx"] == counts["sent"]
    assert not service.active and not service.requests
