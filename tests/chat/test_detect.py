"""chat_format_detect on real chat templates, each with a realistic vocabulary.

Vocabularies: quicktok's bundled encodings for Qwen3 (also Qwen3.5 / QwQ / Qwen3-Coder here), gpt-oss
(o200k_harmony) and Llama 3; the real GGUF tokenizer for Qwen2.5 (slow). Models without a vocabulary
package (LFM2, Gemma, GLM, DeepSeek-R1 distills, ...) get a literal set of their special tokens below.
No Llama 3.1+, Mistral (tekken) or DeepSeek tokenizer is available offline, so those kinds are checked
with literal sets of their special tokens (as written in the models' tokenizer configs), and the Llama
templates also with quicktok's Llama 3 vocabulary, which lacks the 3.1 tokens (`<|python_tag|>`,
`<|eom_id|>`): detection must not need them.
"""

from __future__ import annotations

import logging
from functools import cache

import pytest

from jaxchat.assets import asset_path, template_path
from jaxchat.chat.detect import chat_format_detect, is_token_from_vocab
from jaxchat.chat.spec import (
    DEEPSEEK_CALL_BEGIN,
    DEEPSEEK_CALL_END,
    DEEPSEEK_SEP,
    FORMAT_KINDS,
    MISTRAL_ARGS,
    MISTRAL_CALL_ID,
    VARIANTS,
    chat_format_make,
    reasoning_markers,
)

quicktok = pytest.importorskip("quicktok")


def _src(name: str) -> str:
    return template_path(name).read_text(encoding="utf-8")


@cache
def _quicktok_is_token(encoding: str):
    enc = quicktok.get_encoding(encoding)
    specials = frozenset(enc.special_tokens_set)

    def is_token(s: str) -> bool:
        return s in specials or len(enc.encode_ordinary(s)) == 1

    return is_token


# Literal special-token sets, written in this test because no vocabulary package exists for these models.
LFM2_SPECIALS = {
    "<|pad|>",
    "<|startoftext|>",
    "<|endoftext|>",
    "<|fim_pre|>",
    "<|fim_mid|>",
    "<|fim_suf|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|tool_list_start|>",
    "<|tool_list_end|>",
    "<|tool_call_start|>",
    "<|tool_call_end|>",
    "<|tool_response_start|>",
    "<|tool_response_end|>",
}
LFM25_SPECIALS = LFM2_SPECIALS | {"<think>", "</think>"}
GEMMA2_SPECIALS = {"<bos>", "<eos>", "<pad>", "<unk>", "<start_of_turn>", "<end_of_turn>"}
GEMMA4_SPECIALS = {
    "<bos>",
    "<eos>",
    "<pad>",
    "<|turn>",
    "<turn|>",
    "<|channel>",
    "<channel|>",
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
    "<|image|>",
}
GLM_SPECIALS = {
    "[gMASK]",
    "<sop>",
    "<|endoftext|>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
}
R1_DISTILL_SPECIALS = {
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<think>",
    "</think>",
}
MINIMAX_SPECIALS = {
    "]~b]",
    "]~!b[",
    "[e~[",
    "]<]minimax[>[",
    "<tool_call>",
    "</tool_call>",
    "<mm:think>",
    "</mm:think>",
}
LLAMA31_SPECIALS = {
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
}
# tekken v3 (Mistral-Nemo): no [ARGS] / [CALL_ID] / [THINK]
MISTRAL_V3_SPECIALS = {
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]", "[PREFIX]", "[MIDDLE]",
    "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]",
}
MISTRAL_V11_SPECIALS = MISTRAL_V3_SPECIALS | {"[ARGS]", "[CALL_ID]"}  # Devstral, Mistral-Small-3.2
MISTRAL_V13_SPECIALS = MISTRAL_V11_SPECIALS | {"[THINK]", "[/THINK]"}  # Ministral-3 / Magistral
DEEPSEEK_V3_SPECIALS = R1_DISTILL_SPECIALS | {
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
    "<｜tool▁sep｜>",
}
NO_VOCAB = frozenset()  # judge by the template alone


def _vocab(name: str):
    if isinstance(name, (set, frozenset)):
        return is_token_from_vocab(name)
    return _quicktok_is_token(name)


# template, vocabulary (a quicktok encoding or a literal set), expected str(spec)
CASES = [
    ("Qwen-Qwen3-0.6B.jinja", "qwen3", "hermes_json with reasoning"),
    ("Qwen-QwQ-32B.jinja", "qwen3", "hermes_json with reasoning"),  # enable_thinking=False closes </think>
    ("Qwen3-Coder.jinja", "qwen3", "qwen_xml with reasoning"),  # the shared Qwen3 vocabulary has <think>
    ("Qwen3.5-4B.jinja", "qwen3", "qwen_xml with reasoning"),
    ("openai-gpt-oss-120b.jinja", "o200k_harmony", "harmony with reasoning"),
    # the Llama 3.1-3.3 templates refuse a second call in one message: one call per turn
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3", "llama3_json:single"),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3", "llama3_json:single"),
    ("meta-llama-Llama-3.3-70B-Instruct.jinja", "llama3", "llama3_json:single"),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", LLAMA31_SPECIALS, "llama3_json:single"),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", LLAMA31_SPECIALS, "llama3_json:single"),
    ("meta-llama-Llama-3.3-70B-Instruct.jinja", LLAMA31_SPECIALS, "llama3_json:single"),
    ("fireworks-ai-llama-3-firefunction-v2.jinja", LLAMA31_SPECIALS, "plain"),  # functools[{"name", "arguments"}]
    ("meetkai-functionary-medium-v3.1.jinja", LLAMA31_SPECIALS, "plain"),  # <function=...>, <|python_tag|> code
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", MISTRAL_V3_SPECIALS, "mistral:json_array"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", MISTRAL_V11_SPECIALS, "mistral:json_array"),  # the template decides
    ("unsloth-mistral-Devstral-Small-2507.jinja", MISTRAL_V11_SPECIALS, "mistral:args"),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", MISTRAL_V11_SPECIALS, "mistral:args"),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", MISTRAL_V13_SPECIALS, "mistral:args with reasoning"),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", NO_VOCAB, "mistral:args with reasoning"),  # [THINK] in the template
    ("deepseek-ai-DeepSeek-V3.1.jinja", DEEPSEEK_V3_SPECIALS, "deepseek_v3:v3_1 with reasoning"),  # <think></think> when off
    ("deepseek-ai-DeepSeek-V3.2.jinja", DEEPSEEK_V3_SPECIALS, "plain with reasoning"),  # DSML calls, not this kind
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "llama3", "hermes_json"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "llama3", "hermes_json"),
    ("LFM2-8B-A1B.jinja", LFM2_SPECIALS, "lfm2"),  # renders <|tool_list_start|>, never <|tool_call_start|>
    ("LFM2.5-Instruct.jinja", LFM25_SPECIALS, "lfm2 with reasoning"),  # only "List of tools: [...]"
    ("LFM2.5-8B-A1B.jinja", LFM25_SPECIALS, "lfm2 with reasoning"),
    ("google-gemma-4-31B-it.jinja", GEMMA4_SPECIALS, "gemma4 with reasoning"),
    ("google-gemma-4-31B-it-interleaved.jinja", GEMMA4_SPECIALS, "gemma4 with reasoning"),
    ("google-gemma-2-2b-it.jinja", GEMMA2_SPECIALS, "plain"),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", R1_DISTILL_SPECIALS, "deepseek_v3:r1 with forced reasoning"),
    # this copy appends </think> unless enable_thinking is true, so the prompt does not force reasoning
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", R1_DISTILL_SPECIALS, "deepseek_v3:r1 with reasoning"),
    ("llama-cpp-deepseek-r1.jinja", R1_DISTILL_SPECIALS, "deepseek_v3:r1 with forced reasoning"),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", DEEPSEEK_V3_SPECIALS, "deepseek_v3:r1 with forced reasoning"),
    ("GLM-4.6.jinja", GLM_SPECIALS, "plain with reasoning"),  # <tool_call>name<arg_key>..., not JSON
    ("GLM-4.7-Flash.jinja", GLM_SPECIALS, "plain with reasoning"),
    ("MiniMax-M3.jinja", MINIMAX_SPECIALS, "plain"),
    ("MiniMax-M2.jinja", NO_VOCAB, "plain with forced reasoning"),
    ("StepFun3.5-Flash.jinja", NO_VOCAB, "qwen_xml with forced reasoning"),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", NO_VOCAB, "qwen_xml with reasoning"),
    ("Bielik-11B-v3.0-Instruct.jinja", NO_VOCAB, "hermes_json with reasoning"),
    ("ibm-granite-granite-4.0.jinja", NO_VOCAB, "hermes_json"),
    ("MiMo-VL.jinja", NO_VOCAB, "hermes_json"),
    ("inclusionai-ling-3.0-flash.jinja", NO_VOCAB, "plain with reasoning"),
    ("poolside-Laguna-XS.2.jinja", NO_VOCAB, "plain with reasoning"),
    ("Spark2.5.jinja", NO_VOCAB, "plain with reasoning"),
    ("unsloth-Apriel-1.5.jinja", NO_VOCAB, "plain"),  # mentions <tool_call> only in prose
    ("ByteDance-Seed-OSS.jinja", NO_VOCAB, "plain"),  # <function=...> inside <seed:tool_call>
    ("HuggingFaceTB-SmolLM3-3B.jinja", NO_VOCAB, "plain with reasoning"),
]


@pytest.mark.parametrize("name,vocab,expected", CASES, ids=[c[0].removesuffix(".jinja") for c in CASES])
def test_real_templates(name, vocab, expected):
    spec = chat_format_detect(_src(name), _vocab(vocab))
    assert str(spec) == expected
    assert spec == chat_format_make(spec.kind, spec.reasoning, spec.reasoning_forced, spec.variant)


def test_every_kind_and_flag_is_covered():
    kinds = {expected.split()[0].split(":")[0] for _, _, expected in CASES}
    assert kinds == set(FORMAT_KINDS)
    variants = {expected.split()[0] for _, _, expected in CASES if ":" in expected.split()[0]}
    assert variants == {f"{k}:{v}" for k, vs in VARIANTS.items() for v in vs} - {"llama3_json:semicolon"}
    assert any("with reasoning" in e for _, _, e in CASES)
    assert any("forced reasoning" in e for _, _, e in CASES)


def test_spec_fields():
    qwen3 = chat_format_detect(_src("Qwen-Qwen3-0.6B.jinja"), _vocab("qwen3"))
    assert (qwen3.reasoning_start, qwen3.reasoning_end) == ("<think>", "</think>")
    assert (qwen3.tool_start, qwen3.tool_end) == ("<tool_call>", "</tool_call>")
    harmony = chat_format_detect(_src("openai-gpt-oss-120b.jinja"), _vocab("o200k_harmony"))
    assert harmony.reasoning and not harmony.reasoning_forced
    assert "<|call|>" in harmony.extra_stops
    gemma = chat_format_detect(_src("google-gemma-4-31B-it.jinja"), _vocab(GEMMA4_SPECIALS))
    assert gemma.tool_start == "<|tool_call>" and "<|tool_response>" in gemma.extra_stops
    llama = chat_format_detect(_src("meta-llama-Llama-3.1-8B-Instruct.jinja"), _vocab("llama3"))
    assert not llama.reasoning and llama.reasoning_start == "" and llama.has_tools
    assert (llama.tool_start, llama.tool_end) == ("<|python_tag|>", "")
    assert {"<|eom_id|>", "<|eot_id|>"} <= set(llama.extra_stops)
    mistral = chat_format_detect(_src("mistralai-Ministral-3-14B-Reasoning-2512.jinja"), _vocab(MISTRAL_V13_SPECIALS))
    assert (mistral.reasoning_start, mistral.reasoning_end, mistral.tool_start) == ("[THINK]", "[/THINK]", "[TOOL_CALLS]")
    assert mistral.reasoning and not mistral.reasoning_forced and mistral.stop_markers == ("</s>",)
    r1 = chat_format_detect(_src("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"), _vocab(R1_DISTILL_SPECIALS))
    assert (r1.reasoning_start, r1.tool_start, r1.tool_end) == ("<think>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>")
    assert r1.reasoning_forced and r1.stop_markers == ("<｜end▁of▁sentence｜>",)


def test_lfm2_needs_the_vocabulary():
    # the LFM2-8B-A1B template never writes <|tool_call_start|>: without the vocabulary it is plain
    src = _src("LFM2-8B-A1B.jinja")
    assert "<|tool_call_start|>" not in src
    assert str(chat_format_detect(src, _vocab(NO_VOCAB))) == "plain"
    assert chat_format_detect(src, _vocab(LFM2_SPECIALS)).kind == "lfm2"


def test_r1_distill_template_without_think_uses_the_vocabulary():
    # The original R1-distill template only strips "</think>" from history and never writes <think>;
    # with <think> in the vocabulary the model still reasons (not forced: the prompt does not open it).
    src = _src("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja").replace("<｜Assistant｜><think>\\n", "<｜Assistant｜>")
    assert "<think>" not in src and "</think>" in src
    assert str(chat_format_detect(src, _vocab(R1_DISTILL_SPECIALS))) == "deepseek_v3:r1 with reasoning"
    assert str(chat_format_detect(src, _vocab("llama3"))) == "deepseek_v3:r1"


def test_glm_and_minimax_are_not_hermes_even_with_tool_call_tokens():
    for name, vocab in (("GLM-4.6.jinja", GLM_SPECIALS), ("MiniMax-M3.jinja", MINIMAX_SPECIALS)):
        assert chat_format_detect(_src(name), _vocab(vocab)).kind == "plain"


def test_unrenderable_template_falls_back_to_markers():
    broken = '{% if %}<tool_call>\n{"name": <function-name>, "arguments": <args>}</tool_call><think>'
    assert str(chat_format_detect(broken, _vocab("qwen3"))) == "hermes_json with reasoning"
    raising = "{{ raise_exception('no') }}<|im_start|>assistant\n<think>\n</think>"
    assert str(chat_format_detect(raising, _vocab(NO_VOCAB))) == "plain with reasoning"


def test_synthetic_forced_and_unknown():
    forced = "{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}<think>\n{% endif %}"
    assert str(chat_format_detect(forced, _vocab({"</think>"}))) == "plain with forced reasoning"
    assert str(chat_format_detect("", _vocab(NO_VOCAB))) == "plain"
    assert str(chat_format_detect("", _vocab("qwen3"))) == "plain with reasoning"
    with pytest.raises(TypeError):
        chat_format_detect(b"bytes", _vocab(NO_VOCAB))


def test_hermes_body_forms():
    dumped = "{% for c in m.tool_calls %}{{- '<tool_call>\\n' }}{{- c.function | tojson }}</tool_call>{% endfor %}"
    assert chat_format_detect(dumped, _vocab(NO_VOCAB)).kind == "hermes_json"
    mention = 'Call tools inside <tool_call></tool_call> tags, with a JSON object {"name": ..., "arguments": ...}'
    assert chat_format_detect(mention, _vocab(NO_VOCAB)).kind == "plain"
    xml_like = "{{ '<tool_call>' + tc.name }}{% for k, v in tc.arguments.items() %}<arg_key>{{ k }}</arg_key>"
    assert chat_format_detect(xml_like, _vocab("qwen3")).kind == "plain"


def test_is_token_from_vocab():
    is_token = is_token_from_vocab(iter(["<think>", "a"]))
    assert is_token("<think>") and is_token("a") and not is_token("<thin")


@pytest.mark.slow
def test_qwen25_with_gguf_tokenizer():
    pytest.importorskip("transformers")
    from jaxchat.models.gguf_loader import gguf_tokenizer

    path = asset_path("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    tok = gguf_tokenizer(path, None)  # transformers' GGUF conversion, kept on disk by the loader (as serve uses it)

    def is_token(s: str) -> bool:
        return len(tok.encode(s, add_special_tokens=False)) == 1

    assert is_token("<tool_call>") and not is_token("<think>")
    assert str(chat_format_detect(_src("Qwen-Qwen2.5-7B-Instruct.jinja"), is_token)) == "hermes_json"
    # the model's own template, as shipped in the GGUF
    assert str(chat_format_detect(tok.chat_template, is_token)) == "hermes_json"


def test_new_kinds_markers_are_spelled_as_the_templates_write_them():
    r1, v31 = _src("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"), _src("deepseek-ai-DeepSeek-V3.1.jinja")
    spec = chat_format_make("deepseek_v3", reasoning=True)
    for marker in (spec.tool_start, spec.tool_end, *spec.stop_markers, DEEPSEEK_CALL_BEGIN, DEEPSEEK_CALL_END, DEEPSEEK_SEP):
        assert marker in r1 and marker in v31, marker
    devstral, small = _src("unsloth-mistral-Devstral-Small-2507.jinja"), _src("Mistral-Small-3.2-24B-Instruct-2506.jinja")
    assert "[TOOL_CALLS]" in devstral and MISTRAL_ARGS in devstral and MISTRAL_CALL_ID in small
    ministral = _src("mistralai-Ministral-3-14B-Reasoning-2512.jinja")
    assert all(m in ministral for m in reasoning_markers("mistral"))
    llama = _src("meta-llama-Llama-3.1-8B-Instruct.jinja")
    assert all(m in llama for m in ("<|python_tag|>", "<|eom_id|>", "<|eot_id|>"))


LLAMA_SEMICOLON = (
    "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{% if m.tool_calls %}<|python_tag|>{% for c in m.tool_calls %}"
    '{{ \'{"name": "\' + c.function.name + \'", "parameters": \' + c.function.arguments | tojson + \'}\' }}'
    "{% if not loop.last %}; {% endif %}{% endfor %}<|eom_id|>{% else %}{{ m.content }}<|eot_id|>{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def test_llama_semicolon_variant_when_the_template_joins_calls():
    assert str(chat_format_detect(LLAMA_SEMICOLON, _vocab(LLAMA31_SPECIALS))) == "llama3_json:semicolon"
    joined_by_newline = LLAMA_SEMICOLON.replace("; ", "\\n")
    assert str(chat_format_detect(joined_by_newline, _vocab(LLAMA31_SPECIALS))) == "llama3_json:single"


def test_mistral_from_the_vocabulary_alone():
    src = "{% for m in messages %}[INST]{{ m.content }}[/INST]{% endfor %}"
    assert str(chat_format_detect(src, _vocab(MISTRAL_V3_SPECIALS))) == "mistral:json_array"
    assert str(chat_format_detect(src, _vocab(MISTRAL_V13_SPECIALS))) == "mistral:args with reasoning"
    assert str(chat_format_detect(src, _vocab(NO_VOCAB))) == "plain"


def test_unknown_tool_syntax_falls_back_to_plain_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="jaxchat"):
        spec = chat_format_detect(_src("meetkai-functionary-medium-v3.1.jinja"), _vocab(LLAMA31_SPECIALS),
                                  template_name="functionary-v3.1")
    assert str(spec) == "plain"
    assert "'functionary-v3.1' renders tools" in caplog.text and "come back as text" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jaxchat"):
        chat_format_detect(_src("deepseek-ai-DeepSeek-V3.2.jinja"), _vocab(DEEPSEEK_V3_SPECIALS))
    assert "(unnamed, sha256 " in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jaxchat"):
        for name, vocab in (("google-gemma-2-2b-it.jinja", GEMMA2_SPECIALS),  # renders no tools
                            ("meta-llama-Llama-3.1-8B-Instruct.jinja", LLAMA31_SPECIALS),
                            ("mistralai-Mistral-Nemo-Instruct-2407.jinja", MISTRAL_V3_SPECIALS),
                            ("deepseek-ai-DeepSeek-V3.1.jinja", DEEPSEEK_V3_SPECIALS)):
            chat_format_detect(_src(name), _vocab(vocab), template_name=name)
    assert caplog.text == ""
