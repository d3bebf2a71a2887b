"""A scripted `ServingBackend` for the server tests: deterministic replies, recorded aborts, injected faults.

It honours what a real model under jaxchat's constraints would: `tool_choice` (none/auto/required/
named, `parallel_tool_calls`), `response_format` (an instance of the schema), the thinking switch,
`max_tokens` (finish_reason "length"), `stop`, `n` and `stream_options.include_usage`. It takes the
typed requests of `jaxchat.api` (recorded in `requests`), as the real service does. Words in the
last user message script faults: BOOM (an unexpected exception), REJECT (a RequestError),
FAIL_MIDSTREAM (an error event after two chunks), SLOW (a chunk every `slow_delay` seconds) and
HANG (no output until cancelled). A request is "aborted" when its stream is closed before the end.
It serves chat completions (`chats`) and completions (`texts`) only: its `responses` / `anthropic` adapters are
None (the server answers those routes with 404).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from jaxchat.api import ChatRequest, ChunkStream, CompletionRequest
from jaxchat.chat import RequestError

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


@dataclass(frozen=True)
class FakeApi:
    """One wire API of the fake (`jaxchat.server.WireApi`)."""

    answer: Callable[[ChatRequest | CompletionRequest], Awaitable[dict]]
    stream: Callable[[ChatRequest | CompletionRequest], ChunkStream]


class FakeService:
    model_id = "fake-model"
    max_context = 4096
    responses = None
    anthropic = None

    def __init__(self, slow_delay: float = 0.02) -> None:
        self.slow_delay = slow_delay
        self.requests: list[ChatRequest | CompletionRequest] = []
        self.aborted: list[str] = []
        self.completed: list[str] = []
        self.active: set[str] = set()
        # the wire APIs' adapters, bound here so that a subclass's override of a method is what the server calls
        self.chats = FakeApi(self.chat_completion, self.chat_completion_stream)
        self.texts = FakeApi(self.completion, self.completion_stream)

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

    def close(self) -> None:
        pass

    def expect_request(self) -> None:  # announces nothing (`_Announcing` in test_app records them)
        return None

    async def chat_completion(self, request: ChatRequest) -> dict:
        rid, plan = self._start(request)
        try:
            await self._faults(plan["user"], streaming=False)
            choices = [self._choice(plan, i) for i in range(request.n)]
            self._finish(rid)
            return {
                "id": rid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.model_id,
                "choices": choices,
                "usage": self._usage(plan, request),
            }
        finally:
            self._end(rid)

    def chat_completion_stream(self, request: ChatRequest) -> ChunkStream:
        return ChunkStream(lambda stream: self._chat_chunks(request, stream))

    async def _chat_chunks(self, request: ChatRequest, stream: ChunkStream):
        rid, plan = self._start(request)
        usage_on = request.include_usage
        base = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": self.model_id}
        if usage_on:
            base["usage"] = None
        try:
            await self._faults(plan["user"], streaming=True)
            for i in range(request.n):
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
            stream.usage = self._usage(plan, request)
            if usage_on:
                yield {**base, "choices": [], "usage": stream.usage}
            self._finish(rid)
        finally:
            self._end(rid)

    async def completion(self, request: CompletionRequest) -> dict:
        rid, text, finish, used, prompt_len = self._complete_plan(request)
        try:
            await self._faults(text, streaming=False)
            self._finish(rid)
            choices = [
                {"index": i, "text": text, "logprobs": None, "finish_reason": finish} for i in range(request.n)
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

    def completion_stream(self, request: CompletionRequest) -> ChunkStream:
        return ChunkStream(lambda stream: self._completion_chunks(request, stream))

    async def _completion_chunks(self, request: CompletionRequest, stream: ChunkStream):
        rid, text, finish, used, prompt_len = self._complete_plan(request)
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
            stream.usage = {"prompt_tokens": prompt_len, "completion_tokens": used, "total_tokens": prompt_len + used}
            if request.include_usage:
                yield {**base, "choices": [], "usage": stream.usage}
            self._finish(rid)
        finally:
            self._end(rid)

    # ---- scripting -------------------------------------------------------------------------------
    def _start(self, request: ChatRequest) -> tuple[str, dict]:
        self.requests.append(request)
        rid = f"chatcmpl-fake{next(_ids)}"
        plan = self._plan(request)  # raises RequestError before anything is yielded
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

    def _plan(self, request: ChatRequest) -> dict:
        req = request.constraint
        user = next((_text(m.get("content")) for m in reversed(request.messages) if m.get("role") == "user"), "")
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
        for stop in request.sampling.stop:
            if stop in content:
                content = content[: content.index(stop)]
        tokens = _words(reasoning) + _words(content) + [c["function"]["arguments"] for c in calls]
        limit = request.sampling.max_tokens
        if limit is not None and len(tokens) > limit:
            budget = limit - len(_words(reasoning))
            reasoning = "".join(_words(reasoning)[:limit])
            content = "".join(_words(content)[: max(budget, 0)])
            calls, finish, tokens = [], "length", tokens[:limit]
        prompt = sum(len(_words(_text(m.get("content")))) + 3 for m in request.messages)
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

    def _usage(self, plan: dict, request: ChatRequest) -> dict:
        n = request.n
        done = plan["completion_tokens"] * n
        return {
            "prompt_tokens": plan["prompt_tokens"],
            "completion_tokens": done,
            "total_tokens": plan["prompt_tokens"] + done,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": plan["reasoning_tokens"] * n},
        }

    def _complete_plan(self, request: CompletionRequest) -> tuple[str, str, str, int, int]:
        self.requests.append(request)
        rid = f"cmpl-fake{next(_ids)}"
        prompt = request.prompt
        prompt_text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt))
        words = _words("once upon a time there was a small model that answered every prompt politely.")
        limit = request.sampling.max_tokens
        finish = "length" if len(words) > limit else "stop"
        text = "".join(words[:limit])
        if request.echo:
            text = prompt_text + text
        self.active.add(rid)
        return rid, text, finish, min(len(words), limit), len(_words(prompt_text))
