"""Helpers shared by the reliability tests: SSE clients, error-body checks, idle checks, counters."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

# What an error body must never contain: tracebacks, source locations, file paths, Python internals.
LEAK_PATTERNS = [
    re.compile(p)
    for p in (
        r"Traceback",
        r'File "',
        r"line \d+, in ",
        r"/(?:work|root|home|usr|tmp|opt)/",
        r"site-packages",
        r"\.py\b",
        r"__class__|__globals__|__subclasses__|__mro__|__builtins__",
        r"<(?:function|module|class|bound method) ",
        r"0x[0-9a-f]{6,}",
    )
]


def check_error_body(body: object, where: str = "") -> dict:
    """`body` is an OpenAI error body without internals; returns its `error` object."""
    assert isinstance(body, dict) and set(body) == {"error"}, (where, body)
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, (where, err)
    assert isinstance(err["message"], str) and err["message"], (where, err)
    text = json.dumps(body)
    for pattern in LEAK_PATTERNS:
        assert not pattern.search(text), (where, pattern.pattern, text[:500])
    return err


@dataclass
class StreamResult:
    status: int
    content: str = ""
    reasoning: str = ""
    tool_calls: list = field(default_factory=list)  # [[name, arguments], ...] in index order
    finish_reason: str | None = None
    error: dict | None = None
    usage: dict | None = None
    done: bool = False
    chunks: int = 0
    body: object = None  # the JSON body of a non-200 answer

    def key(self) -> tuple:
        """What must be equal between a request run alone and under load."""
        return (self.content, self.reasoning, json.dumps(self.tool_calls), self.finish_reason)


def parse_sse_line(line: str, res: StreamResult) -> None:
    if not line.startswith("data: "):
        return
    data = line[6:]
    if data == "[DONE]":
        res.done = True
        return
    chunk = json.loads(data)
    res.chunks += 1
    if "error" in chunk:
        res.error = chunk["error"]
        return
    if chunk.get("usage"):
        res.usage = chunk["usage"]
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        res.content += delta.get("content") or ""
        res.reasoning += delta.get("reasoning_content") or ""
        for call in delta.get("tool_calls") or ():
            i = call["index"]
            while len(res.tool_calls) <= i:
                res.tool_calls.append(["", ""])
            fn = call.get("function") or {}
            res.tool_calls[i][0] += fn.get("name") or ""
            res.tool_calls[i][1] += fn.get("arguments") or ""
        if choice.get("finish_reason"):
            res.finish_reason = choice["finish_reason"]


async def stream_chat(client: httpx.AsyncClient, url: str, body: dict, *, headers=None,
                      stop_after_chunks: int | None = None, timeout: float = 120) -> StreamResult:
    """POST a streamed chat request and read it to the end (or close it after `stop_after_chunks`)."""
    body = {**body, "stream": True}
    async with client.stream("POST", url + "/v1/chat/completions", json=body, headers=headers,
                             timeout=timeout) as r:
        res = StreamResult(r.status_code)
        if r.status_code != 200:
            res.body = json.loads(await r.aread())
            return res
        async for line in r.aiter_lines():
            parse_sse_line(line, res)
            if stop_after_chunks is not None and res.chunks >= stop_after_chunks:
                return res  # leaving the block closes the connection mid-stream
    return res


def post_chat(url: str, body: dict, timeout: float = 120, **kw) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=timeout, **kw)


def solo(url: str, body: dict) -> StreamResult:
    async def one():
        async with httpx.AsyncClient() as c:
            return await stream_chat(c, url, body)

    return asyncio.run(one())


def wait_idle(engine, timeout: float = 10.0):
    """Poll until no request is running or waiting and every slot is free; returns the last stats."""
    deadline = time.monotonic() + timeout
    while True:
        s = engine.stats()
        if s.running == 0 and s.waiting == 0 and s.free_slots == s.max_batch:
            return s
        if time.monotonic() > deadline:
            return s
        time.sleep(0.02)


def leaked_slots(stats) -> int:
    """Slots an idle engine's `EngineStats` still shows busy."""
    return stats.max_batch - stats.free_slots


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


REPORTS: list[str] = []  # every report line of the session; tests/conftest.py prints them at the end


def report(name: str, counts: Counter, **extra) -> str:
    parts = [f"{k}={counts.get(k, 0)}" for k in ("sent", "4xx", "5xx", "completed")]
    parts += [f"{k}={v}" for k, v in extra.items()]
    line = f"[{name}] " + " ".join(parts)
    REPORTS.append(line)
    print("\n" + line)
    return line


# ---- request material ----------------------------------------------------------------------------
def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "metric": {"type": "boolean"}},
            "required": ["city", "metric"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone",
        "parameters": {
            "type": "object",
            "properties": {"tz": {"enum": ["UTC", "CET"]}},
            "required": ["tz"],
            "additionalProperties": False,
        },
    },
}
SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"enum": ["yes", "no", "maybe"]},
        "sure": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "minItems": 1, "maxItems": 2},
    },
    "required": ["answer", "sure", "tags"],
    "additionalProperties": False,
}


def json_schema_format(name: str = "verdict", schema: dict = SCHEMA) -> dict:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}


def schema_ok(text: str, schema: dict = SCHEMA) -> bool:
    """A small check of the SCHEMA shape (enum/boolean/array-of-enum, required, no extras)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if not isinstance(value, dict) or set(value) != set(schema["required"]):
        return False
    for key, sub in schema["properties"].items():
        v = value[key]
        if "enum" in sub and v not in sub["enum"]:
            return False
        if sub.get("type") == "boolean" and not isinstance(v, bool):
            return False
        if sub.get("type") == "array" and not (
            isinstance(v, list) and 1 <= len(v) <= 2 and all(x in sub["items"]["enum"] for x in v)
        ):
            return False
    return True


def call_ok(call: list, tools=(WEATHER, TIME)) -> bool:
    name, arguments = call
    fn = next((t["function"] for t in tools if t["function"]["name"] == name), None)
    if fn is None:
        return False
    try:
        args = json.loads(arguments)
    except ValueError:
        return False
    params = fn["parameters"]
    if not isinstance(args, dict) or set(args) != set(params["required"]):
        return False
    for key, sub in params["properties"].items():
        if "enum" in sub and args[key] not in sub["enum"]:
            return False
        if sub.get("type") == "boolean" and not isinstance(args[key], bool):
            return False
    return True
