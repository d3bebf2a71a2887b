"""chat_format_detect on real chat templates, each with a realistic vocabulary.

Vocabularies: quicktok's bundled encodings for Qwen3 (also Qwen3.5 / QwQ / Qwen3-Coder here), gpt-oss
(o200k_harmony) and Llama 3; the real GGUF tokenizer for Qwen2.5 (slow). Models without a vocabulary
package (LFM2, Gemma, GLM, DeepSeek-R1 distills, ...) get a literal set of their special tokens below.
"""

from __future__ import annotations

from functools import cache

import pytest

from jaxchat.assets import asset_path, template_path
from jaxchat.chat.detect import chat_format_detect, is_token_from_vocab
from jaxchat.chat.spec import chat_format_make

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
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3", "plain"),
    ("meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3", "plain"),
    ("meta-llama-Llama-3.3-70B-Instruct.jinja", "llama3", "plain"),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "llama3", "hermes_json"),
    ("NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", "llama3", "hermes_json"),
    ("LFM2-8B-A1B.jinja", LFM2_SPECIALS, "lfm2"),  # renders <|tool_list_start|>, never <|tool_call_start|>
    ("LFM2.5-Instruct.jinja", LFM25_SPECIALS, "lfm2 with reasoning"),  # only "List of tools: [...]"
    ("LFM2.5-8B-A1B.jinja", LFM25_SPECIALS, "lfm2 with reasoning"),
    ("google-gemma-4-31B-it.jinja", GEMMA4_SPECIALS, "gemma4 with reasoning"),
    ("google-gemma-4-31B-it-interleaved.jinja", GEMMA4_SPECIALS, "gemma4 with reasoning"),
    ("google-gemma-2-2b-it.jinja", GEMMA2_SPECIALS, "plain"),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", R1_DISTILL_SPECIALS, "plain with forced reasoning"),
    # this copy appends </think> unless enable_thinking is true, so the prompt does not force reasoning
    ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", R1_DISTILL_SPECIALS, "plain with reasoning"),
    ("llama-cpp-deepseek-r1.jinja", R1_DISTILL_SPECIALS, "plain with forced reasoning"),
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
    assert spec == chat_format_make(spec.kind, spec.reasoning, spec.reasoning_forced)


def test_every_kind_and_flag_is_covered():
    kinds = {expected.split()[0] for _, _, expected in CASES}
    assert kinds == {"plain", "hermes_json", "qwen_xml", "lfm2", "gemma4", "harmony"}
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
    assert not llama.reasoning and llama.reasoning_start == "" and not llama.has_tools


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
    assert str(chat_format_detect(src, _vocab(R1_DISTILL_SPECIALS))) == "plain with reasoning"
    assert str(chat_format_detect(src, _vocab("llama3"))) == "plain"


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
    transformers = pytest.importorskip("transformers")
    path = asset_path("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)

    def is_token(s: str) -> bool:
        return len(tok.encode(s, add_special_tokens=False)) == 1

    assert is_token("<tool_call>") and not is_token("<think>")
    assert str(chat_format_detect(_src("Qwen-Qwen2.5-7B-Instruct.jinja"), is_token)) == "hermes_json"
    # the model's own template, as shipped in the GGUF
    assert str(chat_format_detect(tok.chat_template, is_token)) == "hermes_json"
