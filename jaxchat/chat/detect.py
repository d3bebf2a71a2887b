"""Detect a model's chat format from its Jinja chat template and its vocabulary.

Contract: `chat_format_detect(template_src, is_token) -> ChatFormatSpec`, run once per model.
A marker is *known* when it appears in the template source or is a single token of the vocabulary
(`is_token(marker)`). Rules, from the most specific format to the least:

1. `harmony`     `<|channel|>`, `<|message|>` and `<|start|>` are all known (gpt-oss);
2. `gemma4`      `<|tool_call>` or `<|channel>` is known;
3. `lfm2`        `<|tool_call_start|>` is known (LFM2 templates may never render it; the vocabulary has it);
4. `qwen_xml`    the template contains `<tool_call>`, `<function=` and `<parameter=`;
5. `hermes_json` `<tool_call>` is known and the template writes a JSON object (`{"name": ...`,
                 `{"arguments": ...` or `tool_call | tojson`) right after a `<tool_call>` marker, so `<tool_call>name<arg_key>...`
                 (GLM, Ling, Laguna, Spark) or a prose mention does not count;
6. `plain`       anything else: an unknown tool syntax is never guessed.

`spec.reasoning` is set for the tag kinds when `<think>` and `</think>` are both known (always for
`gemma4` and `harmony`, whose reasoning is part of the format). `spec.reasoning_forced` is set when the
generation prompt rendered with `enable_thinking=False` for a one-user-message conversation still ends
inside an open reasoning block (e.g. DeepSeek-R1-Distill-Llama's `<think>\\n`). A template that cannot be
compiled or rendered is judged by its markers alone (never forced).

`is_token_from_vocab(tokens)` builds an `is_token` from an iterable of token strings.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from jaxchat.chat.spec import ChatFormatSpec, chat_format_make
from jaxchat.chat.template import ChatTemplate, TemplateError

__all__ = ["chat_format_detect", "is_token_from_vocab"]

_HARMONY = ("<|channel|>", "<|message|>", "<|start|>")
_GEMMA4 = ("<|tool_call>", "<|channel>")
_LFM2 = "<|tool_call_start|>"
_TOOL_CALL = "<tool_call>"
_QWEN_XML = ("<tool_call>", "<function=", "<parameter=")
_THINK = ("<think>", "</think>")

# Jinja and string-literal noise between `<tool_call>` and the body it introduces: escaped newlines
# and quotes, whitespace, quotes, concatenation operators, and expression/statement delimiters.
_NOISE = re.compile(r"\\n|\\\"|\s+|['\"~+]|\{\{-?|-?\}\}|\{%-?|-?%\}")
# after the noise is removed: a literal JSON object with name/arguments, or a call object dumped whole
_JSON_BODY = re.compile(r"\{(name|arguments):|[\w.\[\]]+\|tojson")
_BODY_WINDOW = 80

_PROBE_USER = [{"role": "user", "content": "Hello"}]
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {"name": "probe", "description": "Probe.", "parameters": {"type": "object", "properties": {}}},
    }
]


def is_token_from_vocab(tokens: Iterable[str]) -> Callable[[str], bool]:
    """An `is_token` that says whether a string is exactly one of `tokens` (e.g. a tokenizer's vocabulary)."""
    vocab = frozenset(tokens)
    return vocab.__contains__


def chat_format_detect(template_src: str, is_token: Callable[[str], bool]) -> ChatFormatSpec:
    """The chat format of a model with chat template `template_src` and vocabulary `is_token`."""
    if template_src is None:
        template_src = ""
    if not isinstance(template_src, str):
        raise TypeError(f"template_src: expected a string, got {type(template_src).__name__}")

    def known(marker: str) -> bool:
        return marker in template_src or bool(is_token(marker))

    kind = _detect_kind(template_src, known)
    reasoning = all(known(m) for m in _THINK)
    spec = chat_format_make(kind, reasoning=reasoning)
    if spec.reasoning and _generation_prompt_opens_reasoning(template_src, spec):
        spec = chat_format_make(kind, reasoning=True, reasoning_forced=True)
    return spec


def _detect_kind(src: str, known: Callable[[str], bool]) -> str:
    if all(known(m) for m in _HARMONY):
        return "harmony"
    if any(known(m) for m in _GEMMA4):
        return "gemma4"
    if known(_LFM2):
        return "lfm2"
    if all(m in src for m in _QWEN_XML):
        return "qwen_xml"
    if known(_TOOL_CALL) and _has_json_tool_call_body(src):
        return "hermes_json"
    return "plain"


def _has_json_tool_call_body(src: str) -> bool:
    """Whether some `<tool_call>` in the template is directly followed by a JSON object with name/arguments."""
    start = 0
    while (i := src.find(_TOOL_CALL, start)) >= 0:
        start = i + len(_TOOL_CALL)
        body = _NOISE.sub("", src[start : start + _BODY_WINDOW])
        if _JSON_BODY.match(body):
            return True
    return False


def _generation_tail(template: ChatTemplate) -> str | None:
    """What `add_generation_prompt` appends (thinking off), or None when the template cannot render it."""
    for tools in (None, _PROBE_TOOLS):  # tool-use-only templates iterate `tools` unconditionally
        try:
            with_prompt = template.render(_PROBE_USER, tools=tools, add_generation_prompt=True, enable_thinking=False)
            without = template.render(_PROBE_USER, tools=tools, add_generation_prompt=False, enable_thinking=False)
        except TemplateError:
            continue
        return with_prompt.removeprefix(without)
    return None


def _generation_prompt_opens_reasoning(src: str, spec: ChatFormatSpec) -> bool:
    if not src or not spec.reasoning_start:
        return False
    try:
        tail = _generation_tail(ChatTemplate(src))
    except TemplateError:
        return False
    if tail is None:
        return False
    opened = tail.rfind(spec.reasoning_start)
    return opened >= 0 and spec.reasoning_end not in tail[opened + len(spec.reasoning_start) :]
