"""Each seed tool format end to end on a model of the family that speaks it: a tiny random checkpoint of
the family (built here with transformers), the format's REAL chat template and a vocabulary carrying its
markers, served live (`build_chat_service`, what `jaxchat serve` runs, behind the real HTTP app) and called
with the official `openai` SDK. The service must detect the format's kind from the template, and under
`tool_choice: "required"` return a call whose arguments validate against the tool's schema, the same
streamed and not. The weights are random: the grammar alone makes the output a valid call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from tests.tiny_model import tiny_chat_model

# Bounded arguments (an enum and a bounded integer), so that even a random model finishes its call quickly.
SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 9}},
          "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
         {"type": "function", "function": {"name": "get_time", "parameters": {
             "type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}}, "required": ["zone"]}}}]


def qwen3_moe_model(vocab_size: int):
    import transformers

    cfg = transformers.Qwen3MoeConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
        num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645)
    return transformers.Qwen3MoeForCausalLM(cfg)


def gemma4_text_model(vocab_size: int):
    """The parity tests' tiny Gemma 4 (KV-shared layers, per-layer inputs, the MoE block), this vocabulary."""
    import transformers

    from tests.models.conftest import COMMON, GEMMA4

    cfg = transformers.Gemma4TextConfig(**{**COMMON, **GEMMA4, "vocab_size": vocab_size, "vocab_size_per_layer_input": vocab_size,
                                           "max_position_embeddings": 4096, "bos_token_id": 151643, "eos_token_id": 151645})
    return transformers.Gemma4ForCausalLM(cfg)


GEMMA4_TOKENS = ("<|turn>", "<turn|>", "<|tool_call>", "<tool_call|>", "<|channel>", "<channel|>", "<|tool_response>",
                 "<tool_response|>", '<|"|>', "<|tool>", "<tool|>", "<|think|>")
LFM2_LAYERS = dict(vocab_size=0, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=2, layer_types=["conv", "full_attention", "conv", "full_attention"],
                   max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645)
LFM2_MARKERS = ("<|tool_call_start|>", "<|tool_call_end|>", "<|tool_list_start|>", "<|tool_list_end|>")


def lfm2_model(vocab_size: int):
    import transformers

    cfg = transformers.Lfm2Config(**{**LFM2_LAYERS, "vocab_size": vocab_size}, block_multiple_of=32)
    return transformers.Lfm2ForCausalLM(cfg)


def lfm2_moe_model(vocab_size: int):
    import transformers

    cfg = transformers.Lfm2MoeConfig(**{**LFM2_LAYERS, "vocab_size": vocab_size}, moe_intermediate_size=32,
                                     num_experts=8, num_experts_per_tok=2, num_dense_layers=1)
    return transformers.Lfm2MoeForCausalLM(cfg)


def qwen3_5_model(vocab_size: int):
    """A tiny Qwen3.5 text decoder: Gated DeltaNet and gated attention layers in turn."""
    import transformers

    cfg = transformers.Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=8, layer_types=["linear_attention", "full_attention"] * 2, max_position_embeddings=4096,
        tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645)
    return transformers.Qwen3_5ForCausalLM(cfg)


@dataclass(frozen=True)
class Case:
    family: str
    template: str  # a real template from the asset set
    kind: str  # the chat format kind the service must detect
    model: Callable  # vocab size -> a random transformers model of the family
    special_tokens: tuple[str, ...] = ()
    think: bool = True  # False: the request turns thinking off (a random model that may think would never stop)
    reasoning_split: bool = False  # the template opens the reasoning block itself: output is reasoning first


CASES = [
    Case("qwen3_moe", "Qwen3-Coder.jinja", "qwen_xml", qwen3_moe_model),
    Case("gemma4_text", "google-gemma-4-31B-it.jinja", "gemma4", gemma4_text_model, GEMMA4_TOKENS, think=False),
    Case("lfm2", "LFM2.5-Instruct.jinja", "lfm2", lfm2_model, LFM2_MARKERS),
    Case("lfm2_moe", "LFM2-8B-A1B.jinja", "lfm2", lfm2_moe_model, LFM2_MARKERS),
    Case("qwen3_5_text", "Qwen3.5-4B.jinja", "qwen_xml", qwen3_5_model, ("<think>", "</think>"), think=False,
         reasoning_split=True),
]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: c.family)
def served(request, tmp_path_factory):
    from jaxchat.api import build_chat_service
    from tests.server.conftest import Live

    case = request.param
    model_dir = tiny_chat_model(tmp_path_factory.mktemp(case.family), case.template,
                                special_tokens=case.special_tokens, model=case.model)
    service = build_chat_service(model_dir, max_batch=1, max_context=1024, step_token_buckets=(256,))
    try:
        with Live(service) as server:
            yield case, service, server
    finally:
        service.engine.shutdown()


def test_format_detected_and_required_call_is_schema_valid_streamed_and_not(served):
    import jsonschema
    import openai

    case, service, server = served
    assert service.engine.model.config.family == case.family
    assert service.spec.kind == case.kind, service.spec
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    body = dict(model=service.model_id, messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}],
                tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=200,
                extra_body=None if case.think else {"think": False})
    plain = client.chat.completions.create(**body)
    with client.chat.completions.stream(**body) as stream:
        streamed = stream.get_final_completion()
    for reply in (plain, streamed):
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert not choice.message.content
        (call,) = choice.message.tool_calls
        schema = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), schema)
    a, b = plain.choices[0].message.tool_calls[0], streamed.choices[0].message.tool_calls[0]
    assert (a.function.name, json.loads(a.function.arguments)) == (b.function.name, json.loads(b.function.arguments))



def test_reasoning_is_split_from_content_streamed_and_not(served):
    """With thinking on, the Qwen3.5 template ends the prompt inside `<think>`: what the model writes is
    reasoning (`reasoning_content`), never content, until it closes the block. A random model never closes
    it, so the reply is cut at max_tokens with all of its text as reasoning. Sampled with a seed (greedy
    random weights can settle on tokens that decode to nothing), the same streamed and not."""
    import openai

    case, service, server = served
    if not case.reasoning_split:
        pytest.skip(f"{case.template}: the prompt does not open a reasoning block")
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    body = dict(model=service.model_id, messages=[{"role": "user", "content": "Think, then answer: 2+2?"}],
                temperature=1.0, seed=7, max_tokens=12)
    plain = client.chat.completions.create(**body)
    chunks = list(client.chat.completions.create(**body, stream=True))
    streamed_reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    streamed_content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    choice = plain.choices[0]
    reasoning = getattr(choice.message, "reasoning_content", None)
    assert choice.finish_reason == "length", choice
    assert reasoning and reasoning.strip(), choice
    assert not choice.message.content and not streamed_content
    assert streamed_reasoning == reasoning


CUSTOM_REGEX = r"[a-z]{1,8}( [a-z]{1,8}){0,2}"
CUSTOM_LARK = 'start: NAME "(" ARG? ")"\nNAME: /[a-z]{1,6}/\nARG: /[0-9]{1,3}/'


def test_custom_tool_calls_follow_their_grammar_streamed_and_not(served):
    """OpenAI custom tools in the gemma4 (raw input in a verbatim string) and LFM2 (a Python string literal)
    formats: under a named custom choice and under `required` beside a function tool, the call's input matches
    its regex / parses with its Lark grammar, the same streamed and not."""
    import re

    import openai
    from lark import Lark

    case, service, server = served
    if case.kind not in ("gemma4", "lfm2") or case.family == "lfm2_moe":
        pytest.skip("custom tools in the gemma4 and lfm2 formats (one model each)")
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    tools = [{"type": "custom", "custom": {"name": "words", "description": "Say words.", "format": {
        "type": "grammar", "grammar": {"syntax": "regex", "definition": CUSTOM_REGEX}}}},
        {"type": "custom", "custom": {"name": "call", "description": "Call it.", "format": {
            "type": "grammar", "grammar": {"syntax": "lark", "definition": CUSTOM_LARK}}}}]
    for tool, choice in ((tools[0], {"type": "custom", "custom": {"name": "words"}}), (tools[1], "required")):
        body = dict(model=service.model_id, messages=[{"role": "user", "content": "Use the tool."}],
                    tools=[tool, TOOLS[1]], tool_choice=choice, parallel_tool_calls=False, temperature=0,
                    max_tokens=120, extra_body=None if case.think else {"think": False})
        reply = client.chat.completions.create(**body)
        (call,) = reply.choices[0].message.tool_calls
        streamed: dict[int, dict] = {}
        for chunk in client.chat.completions.create(**body, stream=True):
            for part in (tc for ch in chunk.choices for tc in ch.delta.tool_calls or []):
                got = streamed.setdefault(part.index, {"type": part.type, "name": "", "input": ""})
                if part.type == "custom" or got["type"] == "custom":
                    custom = part.model_extra.get("custom") or {}
                    got["name"] += custom.get("name") or ""
                    got["input"] += custom.get("input") or ""
                else:
                    got["name"] += part.function.name or ""
                    got["input"] += part.function.arguments or ""
        if call.type == "function":  # `required` may pick the function tool: its arguments follow its schema
            assert choice == "required" and json.loads(call.function.arguments)["zone"] in ("utc", "cet")
            assert list(streamed.values()) == [{"type": "function", "name": call.function.name,
                                                "input": call.function.arguments}]
            continue
        text = call.custom.input
        if call.custom.name == "words":
            assert re.fullmatch(CUSTOM_REGEX, text), text
        else:
            Lark(CUSTOM_LARK).parse(text)
        assert reply.choices[0].finish_reason == "tool_calls"
        assert list(streamed.values()) == [{"type": "custom", "name": call.custom.name, "input": text}]
