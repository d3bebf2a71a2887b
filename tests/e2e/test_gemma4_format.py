"""The gemma4 tool format end to end on a Gemma 4 model: a tiny random `gemma4_text` checkpoint (KV-shared
layers, per-layer inputs, the MoE block; `tests/models/conftest.build_tiny`) with the Qwen2.5 vocabulary plus
the Gemma 4 template's markers as single tokens, and the real `google-gemma-4-31B-it.jinja` template, served
on 127.0.0.1: the format is detected as gemma4, and under `tool_choice: "required"` the official `openai` SDK
gets a schema-valid call, the same streamed and not."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_truncation import GEMMA4_TOKENS

pytestmark = pytest.mark.slow

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer"},
                                     "hourly": {"type": "boolean"}},
    "required": ["city", "days"], "additionalProperties": False}}}]
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


def tiny_gemma4_chat_model(out):
    from jaxchat.assets import DEFAULT_MODEL, asset_path, template_path
    from jaxchat.models.gguf_loader import gguf_tokenizer
    from tests.models.conftest import build_tiny

    tokenizer = gguf_tokenizer(asset_path(DEFAULT_MODEL), None)
    tokenizer.chat_template = template_path("google-gemma-4-31B-it.jinja").read_text()
    tokenizer.add_tokens(list(GEMMA4_TOKENS), special_tokens=True)  # ids above the vocabulary's 151,936
    vocab = -(-len(tokenizer) // 64) * 64
    build_tiny("gemma4_text", out, vocab_size=vocab, vocab_size_per_layer_input=vocab,
               eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id, pad_token_id=None)
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from jaxchat.api import build_chat_service
    from tests.server.conftest import Live

    model = tiny_gemma4_chat_model(tmp_path_factory.mktemp("gemma4"))
    svc = build_chat_service(model, max_batch=4, max_context=512, batch_buckets=(4,), span_buckets=(512,),
                             length_buckets=(512,))  # one decode and one prefill program: a quick warmup
    assert svc.engine.model.config.family == "gemma4_text"
    assert svc.spec.kind == "gemma4", f"detected as {svc.spec}"
    with Live(svc) as server:
        yield server
    svc.close()


def test_required_tool_call_through_the_openai_sdk_streamed_and_not(live):
    import jsonschema
    import openai

    sdk = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="unused", max_retries=0, timeout=600)
    kw = {"model": live.service.model_id, "messages": MESSAGES, "tools": TOOLS, "tool_choice": "required",
          "temperature": 0, "max_tokens": 120, "extra_body": {"think": False}}
    plain = sdk.chat.completions.create(**kw)
    choice = plain.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert calls and all(name == "get_weather" for name, _ in calls), calls
    for _, args in calls:
        jsonschema.validate(json.loads(args), TOOLS[0]["function"]["parameters"])
    with sdk.chat.completions.stream(**kw) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    assert [(c.function.name, c.function.arguments) for c in final.choices[0].message.tool_calls] == calls
