"""A tool call cut by max_tokens never leaks markup, and the stream and the final message agree.

For every format (a tiny random Qwen2 with the format's real template, its markers added to the
vocabulary as single tokens, so the grammar forces the format) and every tool_choice mode, a greedy
request (thinking off: a random model would think forever) is run once to its end, then again with
every `max_tokens` from 1 to the length of that full output (of its first `AUTO_CUTS` tokens when
"auto" wrote text instead of a call), streamed and not: the deltas joined must equal the non-streamed message, the finish reasons
must agree, `content` must never hold the format's call markup (nor a piece of its opener at the end),
and under "required" / named it must be null.
"""

from __future__ import annotations

import asyncio

import pytest

from jaxchat.api import parse_chat_request
from tests.tiny_model import tiny_chat_model

pytestmark = pytest.mark.slow

HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
GEMMA4_TOKENS = ("<|turn>", "<turn|>", "<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>", "<|tool_response>",
                 "<tool_response|>", '<|"|>', "<|tool>", "<tool|>", "<|think|>")
# kind -> (real template, markers added to the vocabulary)
FORMATS = {
    "hermes_json": ("Qwen-Qwen2.5-7B-Instruct.jinja", ()),
    "qwen_xml": ("Qwen3-Coder.jinja", ()),
    "lfm2": ("LFM2.5-Instruct.jinja", ("<|tool_call_start|>", "<|tool_call_end|>")),
    "gemma4": ("google-gemma-4-31B-it.jinja", GEMMA4_TOKENS),
    "harmony": ("openai-gpt-oss-120b.jinja", HARMONY_TOKENS),
}
# Bounded arguments (an enum and a boolean), so that even a random model finishes its call quickly.
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "hourly": {"type": "boolean"}},
    "required": ["city", "hourly"]}}}]
MODES = {
    "auto": {},
    "required": {"tool_choice": "required"},
    "named": {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
}
FULL_TOKENS = 64
AUTO_CUTS = 24  # under "auto" a random model may write text instead of a call: cut its first tokens only


@pytest.fixture(scope="module", params=sorted(FORMATS))
def service(request, tmp_path_factory):
    from jaxchat.api import build_chat_service

    template, tokens = FORMATS[request.param]
    model = tiny_chat_model(tmp_path_factory.mktemp(request.param), template, special_tokens=tokens)
    svc = build_chat_service(model, max_batch=8, max_context=512, batch_buckets=(8,), span_buckets=(512,),
                             length_buckets=(512,))  # one decode and one prefill program: a quick warmup
    assert svc.spec.kind == request.param, f"{template} was detected as {svc.spec}"
    yield svc
    svc.close()


def _body(mode: str, max_tokens: int, stream: bool) -> dict:
    return {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS, "max_tokens": max_tokens,
            "temperature": 0, "stream": stream, "think": False, **MODES[mode]}


def _streamed(chunks: list[dict]) -> tuple[dict, str | None]:
    """The message a client assembles from the chunks, and the finish reason."""
    msg: dict = {"content": None, "reasoning_content": "", "tool_calls": []}
    finish = None
    for chunk in chunks:
        assert "error" not in chunk, chunk
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("content") is not None:
                msg["content"] = (msg["content"] or "") + delta["content"]
            msg["reasoning_content"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or ():
                if call["index"] == len(msg["tool_calls"]):
                    msg["tool_calls"].append({"name": call["function"]["name"], "arguments": ""})
                msg["tool_calls"][call["index"]]["arguments"] += call["function"]["arguments"]
            finish = choice["finish_reason"] or finish
    return msg, finish


def _plain(reply: dict) -> tuple[dict, str | None]:
    choice = reply["choices"][0]
    m = choice["message"]
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in m.get("tool_calls", [])]
    return {"content": m["content"], "reasoning_content": m.get("reasoning_content", ""), "tool_calls": calls}, \
        choice["finish_reason"]


async def _both(service, mode: str, max_tokens: int) -> tuple[dict, list[dict]]:
    plain = await service.chat_completion(parse_chat_request(_body(mode, max_tokens, False)))
    chunks = [c async for c in service.chat_completion_stream(parse_chat_request(_body(mode, max_tokens, True)))]
    return plain, chunks


def _check_no_markup(service, content: str | None, mode: str) -> None:
    spec = service.spec
    if mode != "auto":
        assert content is None, f"content {content!r} under tool_choice {mode}"
        return
    if not content:
        return
    for marker in (spec.tool_start, spec.tool_end):
        if marker.strip():
            assert marker.strip() not in content, f"call markup {marker!r} in content {content!r}"
    opener = spec.tool_start.strip()
    assert not any(content.endswith(opener[:k]) for k in range(1, len(opener))), content


@pytest.mark.parametrize("mode", sorted(MODES))
def test_cut_calls_stream_as_they_finish(service, mode):
    async def run_all():
        full = await service.chat_completion(parse_chat_request(_body(mode, FULL_TOKENS, False)))
        length = full["usage"]["completion_tokens"]
        if mode == "auto" and not full["choices"][0]["message"].get("tool_calls"):
            length = min(length, AUTO_CUTS)
        cuts = await asyncio.gather(*(_both(service, mode, k) for k in range(1, length + 1)))
        return full, cuts

    full, cuts = asyncio.run(run_all())
    if mode != "auto":
        assert _plain(full)[0]["tool_calls"], f"the grammar did not force a call: {full}"
    for k, (plain, chunks) in enumerate(cuts, start=1):
        message, finish = _plain(plain)
        streamed, streamed_finish = _streamed(chunks)
        _check_no_markup(service, message["content"], mode)
        message["content"] = message["content"] or None  # "" and null say the same
        streamed["content"] = streamed["content"] or None
        assert streamed == message, f"max_tokens={k}: stream {streamed} != message {message}"
        assert streamed_finish == finish, (k, streamed_finish, finish)
        if finish == "length":
            assert plain["usage"]["completion_tokens"] == k
