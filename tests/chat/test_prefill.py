"""`chat_format_prefill` on the generation prompts that real chat templates render."""

from __future__ import annotations

import pytest

from jaxchat.assets import AssetError, template_path
from jaxchat.chat import ChatTemplate, chat_format_make, chat_format_prefill, chat_parse

HERMES_THINK = chat_format_make("hermes_json", reasoning=True)
QWEN_XML = chat_format_make("qwen_xml", reasoning=True)
HARMONY = chat_format_make("harmony")
R1 = chat_format_make("plain", reasoning=True, reasoning_forced=True)
DEEPSEEK_R1 = chat_format_make("deepseek_v3", reasoning=True, reasoning_forced=True, variant="r1")
DEEPSEEK_V31 = chat_format_make("deepseek_v3", reasoning=True, variant="v3_1")
LLAMA3 = chat_format_make("llama3_json")
MISTRAL_THINK = chat_format_make("mistral", reasoning=True)
MESSAGES = [{"role": "user", "content": "Hi"}]


def _tail(template: str, **kwargs) -> str:
    try:
        source = template_path(template).read_text()
    except AssetError as exc:
        pytest.skip(str(exc))
    return ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(MESSAGES, **kwargs)[-200:]


@pytest.mark.parametrize(
    "template, spec, kwargs, expected",
    [
        ("Qwen3.5-4B.jinja", QWEN_XML, {}, "<think>\n"),
        ("Qwen3.5-4B.jinja", QWEN_XML, {"enable_thinking": False}, ""),
        ("Qwen-QwQ-32B.jinja", HERMES_THINK, {"enable_thinking": True}, "<think>\n"),
        ("Qwen-QwQ-32B.jinja", HERMES_THINK, {"enable_thinking": False}, ""),
        ("Qwen-Qwen3-0.6B.jinja", HERMES_THINK, {}, ""),
        ("Qwen-Qwen3-0.6B.jinja", HERMES_THINK, {"enable_thinking": False}, ""),
        ("openai-gpt-oss-120b.jinja", HARMONY, {}, "assistant"),
        ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", R1, {}, "<think>\n"),
        ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", DEEPSEEK_R1, {}, "<think>\n"),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", DEEPSEEK_R1, {"enable_thinking": True}, "<think>\n"),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", DEEPSEEK_R1, {"enable_thinking": False}, ""),
        ("deepseek-ai-DeepSeek-V3.1.jinja", DEEPSEEK_V31, {"enable_thinking": True}, "<think>"),
        ("deepseek-ai-DeepSeek-V3.1.jinja", DEEPSEEK_V31, {"enable_thinking": False}, ""),  # <think></think>
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", LLAMA3, {}, ""),
        ("meta-llama-Llama-3.2-3B-Instruct.jinja", LLAMA3, {}, ""),
        ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", MISTRAL_THINK, {}, ""),  # the model opens [THINK] itself
        ("unsloth-mistral-Devstral-Small-2507.jinja", chat_format_make("mistral"), {}, ""),
    ],
)
def test_prefill_of_real_generation_prompts(template, spec, kwargs, expected):
    assert chat_format_prefill(spec, _tail(template, **kwargs)) == expected


def test_whitespace_after_opened_marker_belongs_to_prefill():
    prefill = chat_format_prefill(HERMES_THINK, "<|im_start|>assistant\n<think>\n\n")
    assert prefill == "<think>\n\n"
    msg = chat_parse(HERMES_THINK, prefill + "Reasoning here.</think>Answer.", False)
    assert (msg.reasoning_content, msg.content) == ("Reasoning here.", "Answer.")


def test_forced_reasoning_without_marker_in_tail():
    assert chat_format_prefill(R1, "<｜Assistant｜>") == "<think>"
    assert chat_format_prefill(chat_format_make("plain", reasoning=True), "<｜Assistant｜>") == ""


def test_closed_block_in_tail_is_no_prefill():
    assert chat_format_prefill(QWEN_XML, "assistant\n<think>\n\n</think>\n\n") == ""


def test_harmony_takes_everything_after_last_start():
    tail = "<|start|>user<|message|>Hi<|end|><|start|>assistant"
    assert chat_format_prefill(HARMONY, tail) == "assistant"
    assert chat_format_prefill(HARMONY, "no start marker") == ""


def test_mistral_think_opened_in_the_prompt():
    assert chat_format_prefill(MISTRAL_THINK, "[INST]Hi[/INST][THINK]") == "[THINK]"
    assert chat_format_prefill(MISTRAL_THINK, "[INST]Hi[/INST][THINK]x[/THINK]") == ""
