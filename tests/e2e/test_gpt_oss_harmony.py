"""gpt-oss end to end in the Harmony format: a tiny random gpt_oss checkpoint with the real o200k_harmony
vocabulary and the real gpt-oss chat template (`tests/harmony_model.py`), served by the real pipeline and
called with the official `openai` SDK over HTTP. jaxchat detects the harmony format from the template and
vocabulary; under tool_choice "required" the grammar makes even random weights produce a call that the
tool's schema accepts, and the streamed reply (rebuilt as the SDK's stream helper does) equals the plain
one."""

from __future__ import annotations

import json

import pytest

from tests.harmony_model import harmony_tokenizer, tiny_gpt_oss_model

# Bounded arguments (an enum and a small integer), so that random weights finish their one call.
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                     "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"]}}}]
MESSAGES = [{"role": "user", "content": "What is the weather in Paris for the next 3 days?"}]


@pytest.fixture(scope="module")
def harmony_dir(tmp_path_factory):
    return tiny_gpt_oss_model(tmp_path_factory.mktemp("harmony") / "tiny-gpt-oss")


def test_tokenizer_encodes_as_quicktok(harmony_dir):
    import quicktok
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(harmony_dir))
    enc = quicktok.get_encoding("o200k_harmony")
    assert len(tok) == 201088 == enc.n_vocab
    for text in ("Hello, World! It's 2024-12-01 and I'll  pay $3,141.59...\n\n  indented\tTAB",
                 "Ünïcödé 日本語のテキスト، العربية 🎉 emoji", "<|start|>assistant<|channel|>analysis<|message|>Hi<|end|>",
                 "def f(x):\n    return x**2  # comment\r\n", "CamelCaseWORDSand lowerUPPER'S don't"):
        assert tok.encode(text, add_special_tokens=False) == enc.encode_with_special_tokens(text), text
    assert harmony_tokenizer  # the builder the checkpoint was made with


def test_required_tool_call_over_the_sdk_streamed_and_not(harmony_dir):
    import jsonschema
    import openai

    from jaxchat.api import build_chat_service
    from tests.server.conftest import Live

    service = build_chat_service(harmony_dir, max_batch=1, max_context=1024, step_token_buckets=(256,))
    try:
        assert service.spec.kind == "harmony" and str(service.spec) == "harmony with reasoning"
        assert service.engine.model.config.family == "gpt_oss"
        with Live(service) as live:
            sdk = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="unused", max_retries=0, timeout=300)
            model = sdk.models.list().data[0].id
            # reasoning_effort "none": the grammar then skips the analysis channel, which random weights would
            # otherwise fill up to max_tokens (a real model closes it with <|end|>)
            body = {"model": model, "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required",
                    "temperature": 0, "max_tokens": 64, "reasoning_effort": "none"}
            plain = sdk.chat.completions.create(**body)
            with sdk.chat.completions.stream(**body) as stream:
                for _ in stream:
                    pass
                streamed = stream.get_final_completion()
    finally:
        service.engine.shutdown()
    for reply in (plain, streamed):
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        calls = choice.message.tool_calls
        assert len(calls) >= 1 and all(c.function.name == "get_weather" for c in calls)
        for call in calls:
            jsonschema.validate(json.loads(call.function.arguments), TOOLS[0]["function"]["parameters"])
    assert [(c.function.name, c.function.arguments) for c in streamed.choices[0].message.tool_calls] == \
        [(c.function.name, c.function.arguments) for c in plain.choices[0].message.tool_calls]
    assert (streamed.choices[0].message.content or "") == (plain.choices[0].message.content or "")
