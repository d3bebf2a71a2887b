"""A scripted `ChatService` for the server tests: deterministic replies, recorded aborts, injected faults.

It honours what a real model under jaxchat's constraints would: `tool_choice` (none/auto/required/
named, `parallel_tool_calls`), `response_format` (an instance of the schema), the thinking switch,
`max_tokens` (finish_reason "length"), `stop`, `n` and `stream_options.include_usage`. Words in the
last user message script faults: BOOM (an unexpected exception), REJECT (a RequestError),
FAIL_MIDSTREAM (an error event after two chunks), SLOW (a chunk every `slow_delay` seconds) and
HANG (no output until cancelled). A request is "aborted" when its stream is closed before the end.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time

from jaxchat.chat import RequestError, chat_constraint_request_from_openai

_ids = itertools.count(1)


def schema_instance(schema: object, hint: str = "Paris") -> object:
    """A small value valid against the JSON-schema subset the tests use."""
    if not isinstance(schema, dict):
        return None
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return schema_instance(schema[key][0], hint)
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties") or {}
        required = schema.get("required") or list(props)
        return {k: schema_instance(props.get(k, {"type": "string"}), hint) for k in required}
    if kind == "array":
        return [
            schema_instance(schema.get("items", {"type": "string"}), hint) for _ in range(schema.get("minItems", 1))
        ]
    if kind == "string":
        return hint
    if kind == "integer":
        return max(int(schema.get("minimum", 3)), 0) if "minimum" in schema else 3
    if kind == "number":
        return float(schema.get("minimum", 1.5))
    if kind == "boolean":
        return True
    return None


def _words(text: str) -> list[str]:
    return re.findall(r"\S+\s*", text)


def _text(content: object) -> str:
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


class FakeService:
    model_id = "fake-model"
    max_context = 4096

    def __init__(self, slow_delay: float = 0.02) -> None:
        self.slow_delay = slow_delay
        self.bodies: list[dict] = []
        self.aborted: list[str] = []
        self.completed: list[str] = []
        self.active: set[str] = set()

    # ---- the protocol ----------------------------------------------------------------------------
    def stats(self) -> dict:
        return {
            "running": len(self.active),
            "waiting": 0,
            "slots_total": 4,
            "slots_busy": len(self.active),
            "compiles": 2,
            "max_context": self.max_context,
        }

    async def chat_completion(self, body: dict) -> dict:
        rid, plan = self._start(body)
        try:
            await self._faults(plan["user"], streaming=False)
            choices = [self._choice(plan, i) for i in range(body.get("n", 1))]
            self._finish(rid)
            return {
                "id": rid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model_id,
                "choices": choices,
                "usage": self._usage(plan, body),
            }
        finally:
            self._end(rid)

    async def chat_completion_stream(self, body: dict):
        rid, plan = self._start(body)
        usage_on = bool(body.get("stream_options", {}).get("include_usage"))
        base = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": self.model_id}
        if usage_on:
            base["usage"] = None
        try:
            await self._faults(plan["user"], streaming=True)
            for i in range(body.get("n", 1)):
                for delta, finish in self._deltas(plan):
                    if "FAIL_MIDSTREAM" in plan["user"] and delta.get("content"):
                        yield {
                            "error": {
                                "message": "generation failed",
                                "type": "server_error",
                                "param": None,
                                "code": None,
                            }
                        }
                        return
                    yield {**base, "choices": [{"index": i, "delta": delta, "logprobs": None, "finish_reason": finish}]}
                    if "SLOW" in plan["user"]:
                        await asyncio.sleep(self.slow_delay)
                    else:
                        await asyncio.sleep(0)
            if usage_on:
                yield {**base, "choices": [], "usage": self._usage(plan, body)}
            self._finish(rid)
        finally:
            self._end(rid)

    async def completion(self, body: dict) -> dict:
        rid, text, finish, used, prompt_len = self._complete_plan(body)
        try:
            await self._faults(text, streaming=False)
            self._finish(rid)
            choices = [
                {"index": i, "text": text, "logprobs": None, "finish_reason": finish} for i in range(body.get("n", 1))
            ]
            return {
                "id": rid,
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.model_id,
                "choices": choices,
                "usage": {"prompt_tokens": prompt_len, "completion_tokens": used, "total_tokens": prompt_len + used},
            }
        finally:
            self._end(rid)

    async def completion_stream(self, body: dict):
        rid, text, finish, used, prompt_len = self._complete_plan(body)
        base = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": self.model_id}
        try:
            pieces = _words(text) or [""]
            for j, piece in enumerate(pieces):
                yield {
                    **base,
                    "choices": [
                        {
                            "index": 0,
                            "text": piece,
                            "logprobs": None,
                            "finish_reason": finish if j == len(pieces) - 1 else None,
                        }
                    ],
                }
                await asyncio.sleep(0)
            if body.get("stream_options", {}).get("include_usage"):
                yield {
                    **base,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": prompt_len,
                        "completion_tokens": used,
                        "total_tokens": prompt_len + used,
                    },
                }
            self._finish(rid)
        finally:
            self._end(rid)

    # ---- scripting -------------------------------------------------------------------------------
    def _start(self, body: dict) -> tuple[str, dict]:
        self.bodies.append(body)
        rid = f"chatcmpl-fake{next(_ids)}"
        plan = self._plan(body)  # raises RequestError before anything is yielded
        self.active.add(rid)
        return rid, plan

    def _finish(self, rid: str) -> None:
        self.completed.append(rid)

    def _end(self, rid: str) -> None:
        self.active.discard(rid)
        if rid not in self.completed:
            self.aborted.append(rid)

    async def _faults(self, user: str, streaming: bool) -> None:
        if "BOOM" in user:
            raise RuntimeError("boom at /secret/path/fake.py line 7")
        if "HANG" in user:
            await asyncio.Event().wait()
        if "SLOW" in user and not streaming:
            await asyncio.sleep(200 * self.slow_delay)

    def _plan(self, body: dict) -> dict:
        req = chat_constraint_request_from_openai(body)
        user = next((_text(m.get("content")) for m in reversed(body["messages"]) if m.get("role") == "user"), "")
        if "REJECT" in user:
            raise RequestError("messages", "the fake service rejected this request")
        reasoning = "The user wants an answer. I will give one." if req.allow_reasoning else ""
        calls, content = [], ""
        callable_names = [t["function"]["name"] for t in req.callable_tools]
        mentioned = [n for n in callable_names if n in user]
        if req.tool_choice == "required" or (req.tool_choice == "auto" and mentioned):
            names = (mentioned or callable_names[:1]) if req.parallel_tool_calls else (mentioned or callable_names)[:1]
            tools = {t["function"]["name"]: t["function"] for t in req.tools}
            for k, name in enumerate(names):
                args = schema_instance(tools[name]["parameters"])
                calls.append(
                    {
                        "id": f"call_{k}_{name}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(args)},
                    }
                )
        elif req.response_format == "json_schema":
            content = json.dumps(schema_instance(req.json_schema or {}))
        elif req.response_format == "json_object":
            content = json.dumps({"answer": "hello"})
        else:
            content = "Hello! You said: " + " ".join(user.split()[:500])
        finish = "tool_calls" if calls else "stop"
        for stop in body.get("stop", []):
            if stop in content:
                content = content[: content.index(stop)]
        tokens = _words(reasoning) + _words(content) + [c["function"]["arguments"] for c in calls]
        limit = body.get("max_tokens")
        if limit is not None and len(tokens) > limit:
            budget = limit - len(_words(reasoning))
            reasoning = "".join(_words(reasoning)[:limit])
            content = "".join(_words(content)[: max(budget, 0)])
            calls, finish, tokens = [], "length", tokens[:limit]
        prompt = sum(len(_words(_text(m.get("content")))) + 3 for m in body["messages"])
        return {
            "user": user,
            "reasoning": reasoning,
            "content": content,
            "calls": calls,
            "finish": finish,
            "completion_tokens": len(tokens),
            "reasoning_tokens": len(_words(reasoning)),
            "prompt_tokens": prompt,
        }

    def _choice(self, plan: dict, index: int) -> dict:
        message = {"role": "assistant", "content": plan["content"] if plan["content"] or not plan["calls"] else None}
        if plan["reasoning"]:
            message["reasoning_content"] = message["reasoning"] = plan["reasoning"]
        if plan["calls"]:
            message["tool_calls"] = plan["calls"]
        return {"index": index, "message": message, "logprobs": None, "finish_reason": plan["finish"]}

    def _deltas(self, plan: dict):
        yield {"role": "assistant", "content": ""}, None
        for piece in _words(plan["reasoning"]):
            yield {"reasoning_content": piece, "reasoning": piece}, None
        for piece in _words(plan["content"]):
            yield {"content": piece}, None
        for k, call in enumerate(plan["calls"]):
            fn = call["function"]
            yield (
                {
                    "tool_calls": [
                        {
                            "index": k,
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": fn["name"], "arguments": ""},
                        }
                    ]
                },
                None,
            )
            args = fn["arguments"]
            cuts = [0, len(args) // 3, 2 * len(args) // 3, len(args)]
            for a, b in itertools.pairwise(cuts):
                if args[a:b]:
                    yield {"tool_calls": [{"index": k, "function": {"arguments": args[a:b]}}]}, None
        yield {}, plan["finish"]

    def _usage(self, plan: dict, body: dict) -> dict:
        n = body.get("n", 1)
        done = plan["completion_tokens"] * n
        return {
            "prompt_tokens": plan["prompt_tokens"],
            "completion_tokens": done,
            "total_tokens": plan["prompt_tokens"] + done,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": plan["reasoning_tokens"] * n},
        }

    def _complete_plan(self, body: dict) -> tuple[str, str, str, int, int]:
        self.bodies.append(body)
        rid = f"cmpl-fake{next(_ids)}"
        prompt = body["prompt"]
        prompt_text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        words = _words("once upon a time there was a small model that answered every prompt politely.")
        limit = body.get("max_tokens", 16)
        finish = "length" if len(words) > limit else "stop"
        text = "".join(words[:limit])
        if body.get("echo"):
            text = prompt_text + text
        self.active.add(rid)
        return rid, text, finish, min(len(words), limit), len(_words(prompt_text))
