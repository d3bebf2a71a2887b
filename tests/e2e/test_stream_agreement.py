"""Stream and non-stream give the same message at temperature 0, for text, reasoning and tool-call replies; with
speculative decoding (`speculative="ngram"`) both give the message decoding without drafts gives.

Runs the real serving pipeline (`ChatService`: template, tokenizer, grammar, engine, parser) on a tiny
random Qwen2 with the real Qwen2.5 tokenizer; the reasoning case uses the QwQ template, whose
generation prompt opens `<think>`. A streamed reply is rebuilt from its chunks the way the `openai` SDK
does (concatenating every string field of a delta) and compared with the plain reply.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from jaxchat.api import parse_chat_request
from tests.tiny_model import IN_PROCESS_SHAPES, tiny_chat_model

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]
# Bounded arguments (an enum and an integer), so that even a random model finishes its one call.
BOUNDED = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer"}}, "required": ["city", "days"]}}}]


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    from jaxchat.api import build_chat_service

    # One decode and one prefill program, the shapes test_truncation's services use: with the run's shared
    # compilation cache, whichever file builds them first compiles them and the other loads them.
    shapes = IN_PROCESS_SHAPES
    qwen25 = tiny_chat_model(tmp_path_factory.mktemp("qwen25"))
    made = {
        "qwen25": build_chat_service(qwen25, speculative="off", **shapes),
        # its verify program compiled up front: under the test run's first set alone (JAXCHAT_PROGRAMS=first,
        # tests/conftest.py) it would never draft
        "qwen25-speculative": build_chat_service(qwen25, speculative="ngram", programs="all", **shapes),
        "qwq": build_chat_service(tiny_chat_model(tmp_path_factory.mktemp("qwq"), "Qwen-QwQ-32B.jinja"),
                                  speculative="off", **shapes),
    }
    yield made
    for service in made.values():
        service.engine.shutdown()


def _accumulate(chunks: list[dict]) -> dict:
    message: dict = {"content": "", "reasoning_content": "", "tool_calls": []}
    finish = None
    for chunk in chunks:
        assert "error" not in chunk, chunk
        for choice in chunk["choices"]:
            delta = choice["delta"]
            message["content"] += delta.get("content") or ""
            message["reasoning_content"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                if "id" in call:
                    assert call["index"] == len(message["tool_calls"])
                    message["tool_calls"].append({"id": call["id"], "name": call["function"]["name"], "arguments": ""})
                message["tool_calls"][call["index"]]["arguments"] += call["function"]["arguments"]
            finish = choice["finish_reason"] or finish
    return {"message": message, "finish_reason": finish}


def _plain(reply: dict) -> dict:
    msg = reply["choices"][0]["message"]
    return {
        "message": {
            "content": msg["content"] or "",
            "reasoning_content": msg.get("reasoning_content", ""),
            "tool_calls": [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                           for c in msg.get("tool_calls", [])],
        },
        "finish_reason": reply["choices"][0]["finish_reason"],
    }


def _both(service, body: dict) -> tuple[dict, dict]:
    async def run():
        plain = await service.chats.answer(parse_chat_request(body))
        chunks = [c async for c in service.chats.stream(parse_chat_request({**body, "stream": True}))]
        return _plain(plain), _accumulate(chunks)

    return asyncio.run(run())


def _same(plain: dict, streamed: dict) -> None:
    for call in plain["message"]["tool_calls"] + streamed["message"]["tool_calls"]:
        call.pop("id")
    assert streamed == plain


CASES = {
    "text": ("qwen25", {}),
    "reasoning": ("qwq", {"chat_template_kwargs": {"enable_thinking": True}}),
    "tool_calls": ("qwen25", {"tools": BOUNDED, "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 240}),
    "named_tool_no_thinking": ("qwq", {"tools": BOUNDED, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                                       "think": False, "max_tokens": 240}),
    "json_schema": ("qwen25", {"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": TOOLS[0]["function"]["parameters"]}}}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_stream_equals_non_stream(services, case):
    name, extra = CASES[case]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 40, "temperature": 0, **extra}
    plain, streamed = _both(services[name], body)
    _same(plain, streamed)
    msg = plain["message"]
    if case == "reasoning":
        assert msg["reasoning_content"]
    if case in ("tool_calls", "named_tool_no_thinking"):
        # The grammar admits only calls, so even a random model ends with complete ones.
        assert msg["tool_calls"] and plain["finish_reason"] == "tool_calls"
        for call in msg["tool_calls"]:
            assert "city" in json.loads(call["arguments"])
    if case == "json_schema" and plain["finish_reason"] == "stop":
        assert "city" in json.loads(msg["content"])


SPECULATIVE_CASES = {
    "text": {},
    "stop_string": {"stop": ["ing"]},
    "tool_calls": {"tools": BOUNDED, "tool_choice": "required", "max_tokens": 120},
    "named_tool": {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {
        "name": "w", "schema": TOOLS[0]["function"]["parameters"]}}},
}


def test_speculative_decoding_gives_the_same_messages_streamed_and_not(services):
    """Greedy replies of the service with prompt-lookup drafts equal those without, streamed and not, over text,
    a stop string, required and named tool calls and a JSON schema; the random model repeats itself, so drafts
    are made and accepted (the comparison is not vacuous)."""
    spec = services["qwen25-speculative"]
    prompt = "Say the words of this list twice: wind rain snow sun cloud fog ice hail, wind rain snow sun."
    before = spec.engine.stats()
    for case, extra in SPECULATIVE_CASES.items():
        body = {"model": "tiny", "messages": [{"role": "user", "content": prompt}], "max_tokens": 60,
                "temperature": 0, **extra}
        want, _ = _both(services["qwen25"], body)
        plain, streamed = _both(spec, body)
        for call in want["message"]["tool_calls"] + plain["message"]["tool_calls"] + streamed["message"]["tool_calls"]:
            call.pop("id")
        assert plain == want, case
        assert streamed == want, case
    after = spec.engine.stats()
    assert after.draft_tokens > before.draft_tokens
    assert after.draft_accepted_tokens > before.draft_accepted_tokens
