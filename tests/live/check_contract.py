"""Live checks: the response contract, stream/non-stream agreement, the thinking switch, the 400 errors.

Usage: python tests/live/check_contract.py --base-url http://127.0.0.1:8000 --model MODEL [--api-key KEY]
Standard library only. Each check is a function of a `livelib.Context`; `CHECKS` lists them.
"""

from __future__ import annotations

import json
import sys

try:
    from . import livelib as lib
except ImportError:  # run as a script
    import livelib as lib

expect = lib.expect
PROMPT = "In one short sentence, what is the capital of France?"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _usage(usage: object, where: str) -> None:
    expect(isinstance(usage, dict), f"{where}: usage missing")
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        expect(isinstance(usage.get(key), int) and usage[key] >= 0, f"{where}: usage.{key} is not an int")
    expect(usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], f"{where}: total != sum")
    details = usage.get("completion_tokens_details")
    if details is not None:
        expect(isinstance(details.get("reasoning_tokens", 0), int), f"{where}: reasoning_tokens not an int")


def check_chat_contract(ctx: lib.Context) -> None:
    body = ctx.chat(PROMPT)
    expect(isinstance(body.get("id"), str) and body.get("object") == "chat.completion", "id/object")
    expect(isinstance(body.get("created"), int) and isinstance(body.get("model"), str), "created/model")
    expect(len(body["choices"]) == 1 and body["choices"][0]["index"] == 0, "one choice with index 0")
    choice = body["choices"][0]
    msg = choice["message"]
    expect(msg["role"] == "assistant", "message.role")
    expect(isinstance(msg.get("content"), str), f"message.content should be a string, got {msg.get('content')!r}")
    expect(not msg.get("tool_calls"), "no tool calls without tools")
    expect(choice["finish_reason"] in ("stop", "length"), f"finish_reason {choice['finish_reason']!r}")
    _usage(body.get("usage"), "chat")


def check_length_and_n(ctx: lib.Context) -> None:
    body = ctx.chat("Write a long story about a dragon.", max_tokens=3, think=False)
    expect(
        body["choices"][0]["finish_reason"] == "length",
        f"max_tokens=3: finish_reason {body['choices'][0]['finish_reason']!r}",
    )
    expect(body["usage"]["completion_tokens"] <= 3, f"max_tokens=3 but {body['usage']['completion_tokens']} tokens")
    two = ctx.chat(PROMPT, n=2, max_tokens=16)
    expect([c["index"] for c in two["choices"]] == [0, 1], "n=2: choices 0 and 1")
    _, acc = ctx.chat_stream(PROMPT, n=2, max_tokens=16)
    expect(sorted(acc) == [0, 1], f"n=2 stream: choice indices {sorted(acc)}")


def check_stream_contract(ctx: lib.Context) -> None:
    chunks, acc = ctx.chat_stream(PROMPT, stream_options={"include_usage": True})
    expect(all(c.get("object") == "chat.completion.chunk" for c in chunks), "chunk object")
    expect(len({c["id"] for c in chunks}) == 1, "one id per stream")
    expect(chunks[-1]["choices"] == [], "the usage chunk has choices: []")
    _usage(chunks[-1].get("usage"), "stream usage chunk")
    expect(all(c.get("usage") is None for c in chunks[:-1]), "earlier chunks have usage: null")
    msg = acc[0]
    expect(msg["role"] == "assistant", "role once, 'assistant'")
    expect(msg["finish_reason"] in ("stop", "length"), f"finish_reason {msg['finish_reason']!r}")
    _, plain = ctx.chat_stream(PROMPT)
    expect(plain[0]["finish_reason"] is not None, "stream without usage still finishes")


def check_stream_agreement(ctx: lib.Context) -> None:
    cases = [
        ("text", PROMPT, {}),
        ("tool call", "What's the weather in Paris?", {"tools": [WEATHER], "tool_choice": "required"}),
        ("reasoning", "Think step by step: what is 17 * 3?", {}),
    ]
    for name, prompt, extra in cases:
        extra = {"max_tokens": min(ctx.max_tokens, 32), **extra}  # agreement holds for a cut reply too
        body = ctx.chat(prompt, **extra)
        chunks, acc = ctx.chat_stream(prompt, stream_options={"include_usage": True}, **extra)
        msg, streamed = body["choices"][0]["message"], acc[0]
        expect(
            (msg.get("content") or "") == streamed["content"],
            f"{name}: content differs: {msg.get('content')!r} vs {streamed['content']!r}",
        )
        expect((msg.get("reasoning_content") or "") == streamed["reasoning_content"], f"{name}: reasoning differs")
        plain_calls = [(c["name"], json.loads(c["arguments"])) for c in lib.message_calls(msg)]
        stream_calls = [(c["name"], json.loads(c["arguments"])) for c in streamed["tool_calls"]]
        expect(plain_calls == stream_calls, f"{name}: tool calls differ: {plain_calls} vs {stream_calls}")
        expect(body["choices"][0]["finish_reason"] == streamed["finish_reason"], f"{name}: finish_reason differs")
        expect(body["usage"]["completion_tokens"] == chunks[-1]["usage"]["completion_tokens"], f"{name}: usage differs")


def check_thinking_switch(ctx: lib.Context) -> None:
    for switch in (
        {"think": False},
        {"reasoning_effort": "none"},
        {"chat_template_kwargs": {"enable_thinking": False}},
    ):
        # a model ignoring the switch opens its reasoning first: the parser reports it from its first tokens on
        switch = {"max_tokens": min(ctx.max_tokens, 16), **switch}
        body = ctx.chat("Think carefully: is 91 prime?", **switch)
        msg = body["choices"][0]["message"]
        expect(not msg.get("reasoning_content") and not msg.get("reasoning"), f"{switch}: reasoning_content present")
        _, acc = ctx.chat_stream("Think carefully: is 91 prime?", **switch)
        expect(not acc[0]["reasoning_content"], f"{switch}: streamed reasoning present")


def check_completions_and_models(ctx: lib.Context) -> None:
    status, _, body = ctx.client.post(
        "/v1/completions", {"model": ctx.model, "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    )
    expect(status == 200 and body.get("object") == "text_completion", f"completions: {status} {str(body)[:200]}")
    expect(isinstance(body["choices"][0]["text"], str), "completions: choices[0].text")
    expect(body["choices"][0]["finish_reason"] in lib.FINISH_REASONS, "completions: finish_reason")
    _usage(body.get("usage"), "completions")
    status, models = ctx.client.get("/v1/models")
    expect(status == 200 and any(m["id"] == ctx.model for m in models["data"]), f"/v1/models lacks {ctx.model}")


BAD_REQUESTS = [
    ({"temperature": 5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"n": 0}, "n"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"stream": True, "temperature": -1}, "temperature"),
]


def _error(status: int, body: object, want_status: int, where: str) -> dict:
    expect(status == want_status, f"{where}: HTTP {status}, expected {want_status}: {str(body)[:200]}")
    expect(isinstance(body, dict) and isinstance(body.get("error"), dict), f"{where}: no OpenAI error body")
    err = body["error"]
    expect(isinstance(err.get("message"), str) and err["message"], f"{where}: error.message")
    expect(all(k in err for k in ("type", "param", "code")), f"{where}: error needs type, param, code")
    return err


def check_errors(ctx: lib.Context) -> None:
    for fields, param in BAD_REQUESTS:
        body = {**ctx.body("hi"), **fields}
        status, _, reply = ctx.client.post("/v1/chat/completions", body)
        err = _error(status, reply, 400, f"{fields}")
        expect(err["param"] == param, f"{fields}: param {err['param']!r}, expected {param!r}")
        expect(err["type"] == "invalid_request_error", f"{fields}: type {err['type']!r}")
    status, _, reply = ctx.client.post("/v1/chat/completions", {**ctx.body("hi"), "model": "no-such-model-x"})
    err = _error(status, reply, 404, "unknown model")
    expect(err["code"] == "model_not_found", f"unknown model: code {err['code']!r}")
    status, _, reply = ctx.client.post("/v1/chat/completions", raw=b'{"messages": [')
    _error(status, reply, 400, "truncated JSON")


CHECKS = [
    ("contract.chat", check_chat_contract),
    ("contract.stream", check_stream_contract),
    ("contract.length_and_n", check_length_and_n),
    ("contract.completions_models", check_completions_and_models),
    ("agreement.stream_vs_plain", check_stream_agreement),
    ("thinking.switch_off", check_thinking_switch),
    ("errors.400", check_errors),
]

if __name__ == "__main__":
    sys.exit(lib.main_for(CHECKS, description=__doc__))
