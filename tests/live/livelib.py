"""Standard-library helpers for the live checks: HTTP and SSE, stream accumulation, a JSON-schema subset.

Contract: nothing here imports a third-party package, so these scripts run against any
OpenAI-compatible server from a bare Python 3.11. `Client(base_url, api_key)` accepts a base URL
with or without the trailing `/v1`. `CheckFailed` carries the reason a check failed. The
`accumulate` helper rebuilds each choice's message from stream chunks and fails on what the
`openai` SDK cannot accumulate (a second `role`, a tool-call delta without `index`, a repeated
`id` or `function.name` for one index). `schema_errors(value, schema)` supports type, properties,
required, additionalProperties, items, enum, const, minimum/maximum, minLength/maxLength,
minItems/maxItems, pattern, anyOf/oneOf/allOf and local `$ref`s to `#/$defs/...`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import re
import sys
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable

FINISH_REASONS = ("stop", "length", "tool_calls")


class CheckFailed(AssertionError):
    pass


def expect(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


class Client:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 300.0) -> None:
        base = base_url.rstrip("/")
        self.root = base.removesuffix("/v1")
        self.api_key = api_key
        self.timeout = timeout

    def _request(
        self, method: str, path: str, body: object = None, raw: bytes | None = None, headers: dict | None = None
    ):
        url = self.root + path
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode("utf-8"))
        hdrs = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.api_key:
            hdrs["Authorization"] = f"Bearer {self.api_key}"
        hdrs.update(headers or {})
        req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as err:
            return err

    def get(self, path: str) -> tuple[int, object]:
        with self._request("GET", path) as resp:
            return resp.status, _decode(resp.read())

    def post(self, path: str, body: dict | None = None, raw: bytes | None = None, headers: dict | None = None):
        """POST a JSON body; returns (status, headers, decoded JSON or text)."""
        with self._request("POST", path, body, raw, headers) as resp:
            return resp.status, dict(resp.headers), _decode(resp.read())

    def stream(self, path: str, body: dict) -> tuple[int, dict, list]:
        """POST with stream=true; returns (status, headers, events) where events are decoded `data:` payloads
        ('[DONE]' kept as the string); a non-SSE reply comes back as its decoded JSON in place of events."""
        with self._request("POST", path, body) as resp:
            headers = dict(resp.headers)
            if not headers.get("Content-Type", headers.get("content-type", "")).startswith("text/event-stream"):
                return resp.status, headers, _decode(resp.read())
            events, data = [], []
            for raw_line in resp:
                line = raw_line.decode("utf-8").rstrip("\r\n")
                if line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))
                elif not line and data:
                    payload = "\n".join(data)
                    events.append(payload if payload == "[DONE]" else json.loads(payload))
                    data = []
            return resp.status, headers, events


def _decode(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def accumulate(chunks: list[dict]) -> dict[int, dict]:
    """Per choice index: {"role", "content", "reasoning_content", "tool_calls", "finish_reason"}."""
    out: dict[int, dict] = {}
    for chunk in chunks:
        for choice in chunk.get("choices") or []:
            idx = choice["index"]
            msg = out.setdefault(
                idx, {"role": None, "content": "", "reasoning_content": "", "tool_calls": {}, "finish_reason": None}
            )
            delta = choice.get("delta") or {}
            if delta.get("role") is not None:
                expect(msg["role"] is None, f"choice {idx}: role sent twice")
                msg["role"] = delta["role"]
            msg["content"] += delta.get("content") or ""
            msg["reasoning_content"] += delta.get("reasoning_content") or ""
            for tc in delta.get("tool_calls") or []:
                expect("index" in tc, f"choice {idx}: tool-call delta without index: {tc}")
                call = msg["tool_calls"].setdefault(tc["index"], {"id": None, "name": None, "arguments": ""})
                fn = tc.get("function") or {}
                for key, value in (("id", tc.get("id")), ("name", fn.get("name"))):
                    if value is not None:
                        expect(call[key] is None, f"choice {idx}: tool call {tc['index']} got {key} twice")
                        call[key] = value
                call["arguments"] += fn.get("arguments") or ""
            if choice.get("finish_reason") is not None:
                expect(msg["finish_reason"] is None, f"choice {idx}: finish_reason sent twice")
                msg["finish_reason"] = choice["finish_reason"]
    for msg in out.values():
        msg["tool_calls"] = [msg["tool_calls"][k] for k in sorted(msg["tool_calls"])]
    return out


def message_calls(message: dict) -> list[dict]:
    """A non-streamed message's tool calls as [{"id", "name", "arguments"}]."""
    return [
        {"id": c.get("id"), "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in message.get("tool_calls") or []
    ]


# ---- a JSON-schema subset ----------------------------------------------------------------------
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is_type(value: object, kind: str) -> bool:
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, _TYPES.get(kind, object))


def schema_errors(value: object, schema: object, path: str = "$", root: object = None) -> list[str]:
    root = schema if root is None else root
    if not isinstance(schema, dict):
        return []
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target.get(part, {}) if part else target
        return schema_errors(value, target, path, root)
    errors: list[str] = []
    kinds = schema.get("type")
    if kinds is not None:
        kinds = kinds if isinstance(kinds, list) else [kinds]
        if not any(_is_type(value, k) for k in kinds):
            return [f"{path}: expected type {kinds}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not in enum {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        errors.append(f"{path}: expected const {schema['const']!r}")
    for key, sub in (("anyOf", any), ("oneOf", lambda r: sum(r) == 1)):
        if key in schema and not sub([not schema_errors(value, s, path, root) for s in schema[key]]):
            errors.append(f"{path}: does not match {key}")
    for s in schema.get("allOf", []):
        errors += schema_errors(value, s, path, root)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{path}: missing required property {name!r}")
        for name, item in value.items():
            if name in props:
                errors += schema_errors(item, props[name], f"{path}.{name}", root)
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}: unexpected property {name!r}")
            elif isinstance(schema.get("additionalProperties"), dict):
                errors += schema_errors(item, schema["additionalProperties"], f"{path}.{name}", root)
    if isinstance(value, list):
        for i, item in enumerate(value):
            errors += schema_errors(item, schema.get("items"), f"{path}[{i}]", root)
        if len(value) < schema.get("minItems", 0) or len(value) > schema.get("maxItems", len(value)):
            errors.append(f"{path}: {len(value)} items is outside minItems/maxItems")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
            errors.append(f"{path}: length {len(value)} is outside minLength/maxLength")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: {value!r} does not match pattern {schema['pattern']!r}")
    if _is_type(value, "number"):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: {value} < minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: {value} > maximum {schema['maximum']}")
    return errors


# ---- running checks ----------------------------------------------------------------------------
Check = Callable[["Context"], None]


class Context:
    def __init__(self, client: Client, model: str, max_tokens: int = 256) -> None:
        self.client = client
        self.model = model
        self.max_tokens = max_tokens

    def body(self, messages: list | str, **fields) -> dict:
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return {
            "model": self.model,
            "messages": messages,
            "temperature": 0,
            "seed": 7,
            "max_tokens": self.max_tokens,
            **fields,
        }

    def chat(self, messages: list | str, **fields) -> dict:
        status, _, body = self.client.post("/v1/chat/completions", self.body(messages, **fields))
        expect(status == 200, f"chat completion: HTTP {status}: {str(body)[:300]}")
        return body

    def chat_stream(self, messages: list | str, **fields) -> tuple[list[dict], dict[int, dict]]:
        status, _, events = self.client.stream("/v1/chat/completions", self.body(messages, stream=True, **fields))
        expect(status == 200 and isinstance(events, list), f"stream: HTTP {status}: {str(events)[:300]}")
        expect(events and events[-1] == "[DONE]", "stream: does not end with data: [DONE]")
        chunks = events[:-1]
        expect(all(isinstance(c, dict) and "error" not in c for c in chunks), f"stream: error event {chunks[-1:]}")
        return chunks, accumulate(chunks)


def run_check(name: str, fn: Check, ctx: Context) -> tuple[str, str, float]:
    """One check: (name, "ok" | "FAIL: reason", seconds), its line printed."""
    started = time.monotonic()
    try:
        fn(ctx)
        outcome = "ok"
    except CheckFailed as exc:
        outcome = f"FAIL: {exc}"
    except Exception as exc:  # noqa: BLE001 - a crashing check is a failed check, reported with its cause
        outcome = f"FAIL: {type(exc).__name__}: {exc} | {traceback.format_exc(limit=2).splitlines()[-2].strip()}"
    seconds = time.monotonic() - started
    print(
        f"{'PASS' if outcome == 'ok' else 'FAIL'} {name} ({seconds:.1f}s){'' if outcome == 'ok' else ': ' + outcome[6:]}",
        flush=True,
    )
    return name, outcome, seconds


def run_checks(checks: list[tuple[str, Check]], ctx: Context, only: str | None = None,
               concurrency: int = 1) -> list[tuple[str, str, float]]:
    """Run checks, `concurrency` at a time (each check's own requests stay in order; the server batches the
    requests of checks running together); returns (name, "ok" | "FAIL: reason", seconds) in the checks' order
    and prints a line per check as it ends."""
    chosen = [(name, fn) for name, fn in checks if not only or only in name]
    if concurrency <= 1:
        return [run_check(name, fn, ctx) for name, fn in chosen]
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(lambda check: run_check(*check, ctx), chosen))


def parse_args(argv: list[str] | None = None, description: str = "") -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000 or http://127.0.0.1:8000/v1")
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per HTTP request")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--only", default=None, help="run only the checks whose name contains this")
    ap.add_argument("--concurrency", type=int, default=1, help="checks run at a time (the server batches them)")
    return ap.parse_args(argv)


def main_for(checks: list[tuple[str, Check]], argv: list[str] | None = None, description: str = "") -> int:
    args = parse_args(argv, description)
    ctx = Context(Client(args.base_url, args.api_key, args.timeout), args.model, args.max_tokens)
    started = time.monotonic()
    results = run_checks(checks, ctx, args.only, args.concurrency)
    failed = [r for r in results if r[1] != "ok"]
    print(f"\n{len(results) - len(failed)} passed, {len(failed)} failed, {time.monotonic() - started:.1f}s")
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit("livelib is a library; run run_all.py")
