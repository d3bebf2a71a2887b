"""A tool call cut by max_tokens never leaks markup, and the stream and the final message agree.

For every format (a tiny random Qwen2 with the format's real template, its markers added to the
vocabulary as single tokens, so the grammar forces the format) and every tool_choice mode, a greedy
request (thinking off: a random model would think forever) is run once to its end, then again with
each `max_tokens` from 1 to 12 and every fourth one after up to the length of that full output, its last
four included (up to its first `AUTO_CUTS` tokens when "auto" wrote text instead of a call), streamed and not: the deltas joined must equal the non-streamed message, the finish reasons
must agree, `content` must never hold the format's call markup (nor a piece of its opener at the end),
and under "required" / named it must be null.
"""

from __future__ import annotations

import asyncio

import pytest

from jaxchat.api import parse_chat_request
from tests.tiny_model import IN_PROCESS_SHAPES, tiny_chat_model

pytestmark = pytest.mark.slow

HARMONY_TOKENS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
GEMMA4_TOKENS = ("<|turn>", "<turn|>", "<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>", "<|tool_response>",
                 "<tool_response|>", '<|"|>', "<|tool>", "<tool|>", "<|think|>")
LLAMA3_TOKENS = ("<|python_tag|>", "<|eom_id|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>",
                 "<|begin_of_text|>")
MISTRAL_TOKENS = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                  "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "</s>")
DEEPSEEK_TOKENS = ("<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
                   "<｜tool▁sep｜>", "<｜Assistant｜>", "<｜User｜>", "<｜end▁of▁sentence｜>", "<｜begin▁of▁sentence｜>",
                   "<think>", "</think>")
# name -> (real template, markers added to the vocabulary, the format it must be detected as)
FORMATS = {
    "hermes_json": ("Qwen-Qwen2.5-7B-Instruct.jinja", (), "hermes_json"),
    "qwen_xml": ("Qwen3-Coder.jinja", (), "qwen_xml"),
    "lfm2": ("LFM2.5-Instruct.jinja", ("<|tool_call_start|>", "<|tool_call_end|>"), "lfm2"),
    "gemma4": ("google-gemma-4-31B-it.jinja", GEMMA4_TOKENS, "gemma4"),
    "harmony": ("openai-gpt-oss-120b.jinja", HARMONY_TOKENS, "harmony"),
    "llama3_json": ("meta-llama-Llama-3.1-8B-Instruct.jinja", LLAMA3_TOKENS, "llama3_json"),
    "mistral_args": ("unsloth-mistral-Devstral-Small-2507.jinja", MISTRAL_TOKENS, "mistral"),
    "mistral_json_array": ("mistralai-Mistral-Nemo-Instruct-2407.jinja", MISTRAL_TOKENS, "mistral"),
    # the DeepSeek templates shipped with the models never render tools; llama.cpp's R1 template does. Its
    # generation prompt always opens <think>, which a random model never closes: its calls are not forced
    "deepseek_v3": ("llama-cpp-deepseek-r1.jinja", DEEPSEEK_TOKENS, "deepseek_v3"),
}
LONG_PROMPTS = {"mistral_args": 2048}  # Devstral's template writes a system prompt of ~1,200 tokens
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
EVERY_CUT_UP_TO = 12  # every cut up to here (the opener, the name, the first argument), then every 4th and the last 4


def cut_points(length: int) -> list[int]:
    """The max_tokens values tried for an output of `length` tokens (CI time: a cut costs a prefill)."""
    return sorted({*range(1, min(length, EVERY_CUT_UP_TO) + 1), *range(EVERY_CUT_UP_TO, length + 1, 4),
                   *range(max(1, length - 3), length + 1)})


@pytest.fixture(scope="module", params=sorted(FORMATS))
def service(request, tmp_path_factory):
    from jaxchat.api import build_chat_service

    template, tokens, kind = FORMATS[request.param]
    model = tiny_chat_model(tmp_path_factory.mktemp(request.param), template, special_tokens=tokens)
    context = LONG_PROMPTS.get(request.param, 512)
    svc = build_chat_service(model, **{**IN_PROCESS_SHAPES, "max_context": context})
    # one decode program, one ragged one and their sampler: a quick warmup
    assert svc.spec.kind == kind, f"{template} was detected as {svc.spec}"
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
    plain = await service.chats.answer(parse_chat_request(_body(mode, max_tokens, False)))
    chunks = [c async for c in service.chats.stream(parse_chat_request(_body(mode, max_tokens, True)))]
    return plain, chunks


def _check_no_markup(service, content: str | None, mode: str) -> None:
    spec = service.spec
    if mode != "auto":
        assert content is None, f"content {content!r} under tool_choice {mode}"
        return
    if not content:
        return
    assert "get_weather" not in content, f"a call in content {content!r}"  # bare llama3_json calls have no marker
    for marker in (spec.tool_start, spec.tool_end):
        if marker.strip():
            assert marker.strip() not in content, f"call markup {marker!r} in content {content!r}"
    opener = spec.tool_start.strip()
    assert not any(content.endswith(opener[:k]) for k in range(1, len(opener))), content


@pytest.mark.parametrize("mode", sorted(MODES))
def test_cut_calls_stream_as_they_finish(service, mode):
    async def run_all():
        full = await service.chats.answer(parse_chat_request(_body(mode, FULL_TOKENS, False)))
        length = full["usage"]["completion_tokens"]
        if mode == "auto" and not full["choices"][0]["message"].get("tool_calls"):
            length = min(length, AUTO_CUTS)
        ks = cut_points(length)
        cuts = await asyncio.gather(*(_both(service, mode, k) for k in ks))
        return full, list(zip(ks, cuts, strict=True))

    full, cuts = asyncio.run(run_all())
    if mode != "auto" and not service.spec.reasoning_forced:
        assert _plain(full)[0]["tool_calls"], f"the grammar did not force a call: {full}"
    for k, (plain, chunks) in cuts:
        message, finish = _plain(plain)
        streamed, streamed_finish = _streamed(chunks)
        _check_no_markup(service, message["content"], mode)
        message["content"] = message["content"] or None  # "" and null say the same
        streamed["content"] = streamed["content"] or None
        assert streamed == message, f"max_tokens={k}: stream {streamed} != message {message}"
        assert streamed_finish == finish, (k, streamed_finish, finish)
        if finish == "length":
            assert plain["usage"]["completion_tokens"] == k
