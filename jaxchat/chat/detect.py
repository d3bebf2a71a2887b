"""Detect a model's chat format from its Jinja chat template and its vocabulary.

Contract: `chat_format_detect(template_src, is_token, template_name="") -> ChatFormatSpec`, run once
per model. A marker is *known* when it appears in the template source or is a single token of the
vocabulary (`is_token(marker)`). Rules, from the most specific format to the least:

1. `harmony`     `<|channel|>`, `<|message|>` and `<|start|>` are all known (gpt-oss);
2. `gemma4`      `<|tool_call>` or `<|channel>` is known;
3. `lfm2`        `<|tool_call_start|>` is known (LFM2 templates may never render it; the vocabulary has it);
4. `deepseek_v3` the template writes `<｜tool▁calls▁begin｜>` and `<｜tool▁sep｜>` (the template, not
                 the vocabulary: V3.2 and V4 keep these tokens but write DSML calls); variant `r1` when
                 a ```json fence follows `<｜tool▁sep｜>` in the template, else `v3_1`;
5. `qwen_xml`    the template contains `<tool_call>`, `<function=` and `<parameter=`;
6. `hermes_json` `<tool_call>` is known and the template writes a JSON object (`{"name": ...`,
                 `{"arguments": ...` or `tool_call | tojson`) right after a `<tool_call>` marker, so `<tool_call>name<arg_key>...`
                 (GLM, Ling, Laguna, Spark) or a prose mention does not count;
7. `mistral`     `[TOOL_CALLS]` is known; variant `args` when `[ARGS]` is in the template (or, for a
                 template that writes no `[TOOL_CALLS]`, in the vocabulary), else `json_array`;
8. `llama3_json` the template writes (or describes) a JSON call `{"name": ..., "parameters": ...}`;
                 variant `semicolon` when it renders two calls of one assistant message joined by
                 `;`, else `single` (the Llama 3.1-3.3 templates refuse a second call);
9. `plain`       anything else: an unknown tool syntax is never guessed. When such a template renders
                 tools (`ChatTemplate.tools_enabled`), a warning naming the template is logged:
                 the model's calls will come back as text.

`spec.reasoning` is set when the kind's reasoning markers (`[THINK]`/`[/THINK]` for mistral,
`<think>`/`</think>` otherwise) are both known (always for `gemma4` and `harmony`, whose reasoning is
part of the format). `spec.reasoning_forced` is set when the generation prompt rendered with
`enable_thinking=False` for a one-user-message conversation still ends inside an open reasoning
block (e.g. DeepSeek-R1-Distill-Llama's `<think>\\n`). A template that cannot be compiled or rendered
is judged by its markers alone (never forced, single Llama calls).

`is_token_from_vocab(tokens)` builds an `is_token` from an iterable of token strings.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable

from jaxchat.chat.spec import DEEPSEEK_SEP, MISTRAL_ARGS, ChatFormatSpec, chat_format_make, reasoning_markers
from jaxchat.chat.template import ChatTemplate, TemplateError

__all__ = ["chat_format_detect", "is_token_from_vocab"]

log = logging.getLogger("jaxchat")

_HARMONY = ("<|channel|>", "<|message|>", "<|start|>")
_GEMMA4 = ("<|tool_call>", "<|channel>")
_LFM2 = "<|tool_call_start|>"
_DEEPSEEK = ("<｜tool▁calls▁begin｜>", DEEPSEEK_SEP)
_TOOL_CALL = "<tool_call>"
_QWEN_XML = ("<tool_call>", "<function=", "<parameter=")
_MISTRAL = "[TOOL_CALLS]"

# Jinja and string-literal noise between `<tool_call>` and the body it introduces: escaped newlines
# and quotes, whitespace, quotes, concatenation operators, and expression/statement delimiters.
_NOISE = re.compile(r"\\n|\\\"|\s+|['\"~+]|\{\{-?|-?\}\}|\{%-?|-?%\}")
# after the noise is removed: a literal JSON object with name/arguments, or a call object dumped whole
_JSON_BODY = re.compile(r"\{(name|arguments):|[\w.\[\]]+\|tojson")
_BODY_WINDOW = 80
# after the noise is removed: Llama 3's `{"name": <name>, "parameters": <arguments>}`
_LLAMA_CALL = re.compile(r"\{name:[^{},]{0,80},parameters:")
_FENCE_WINDOW = 160

_PROBE_USER = [{"role": "user", "content": "Hello"}]
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {"name": "probe", "description": "Probe.", "parameters": {"type": "object", "properties": {}}},
    }
]
_PROBE_TWO_CALLS = [
    *_PROBE_USER,
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call{i}abcd", "type": "function", "function": {"name": f"probe_{i}", "arguments": "{}"}}
        for i in (1, 2)
    ]},
]


def is_token_from_vocab(tokens: Iterable[str]) -> Callable[[str], bool]:
    """An `is_token` that says whether a string is exactly one of `tokens` (e.g. a tokenizer's vocabulary)."""
    vocab = frozenset(tokens)
    return vocab.__contains__


def chat_format_detect(template_src: str, is_token: Callable[[str], bool], template_name: str = "") -> ChatFormatSpec:
    """The chat format of a model with chat template `template_src` (named `template_name` in logs)
    and vocabulary `is_token`."""
    if template_src is None:
        template_src = ""
    if not isinstance(template_src, str):
        raise TypeError(f"template_src: expected a string, got {type(template_src).__name__}")

    def known(marker: str) -> bool:
        return marker in template_src or bool(is_token(marker))

    template = _compiled(template_src)
    kind = _detect_kind(template_src, known)
    variant = _variant(kind, template_src, template, known)
    reasoning = all(known(m) for m in reasoning_markers(kind))
    spec = chat_format_make(kind, reasoning=reasoning, variant=variant)
    if spec.reasoning and _generation_prompt_opens_reasoning(template, spec):
        spec = chat_format_make(kind, reasoning=True, reasoning_forced=True, variant=variant)
    if kind == "plain" and template is not None and template.tools_enabled:
        log.warning("Chat template %s renders tools, but its tool-call syntax is none that jaxchat knows: "
                    "using the plain format, so the model's tool calls come back as text",
                    _describe(template_name, template_src))
    return spec


def _describe(name: str, src: str) -> str:
    return repr(name) if name else f"(unnamed, sha256 {hashlib.sha256(src.encode()).hexdigest()[:12]})"


def _compiled(src: str) -> ChatTemplate | None:
    if not src:
        return None
    try:
        return ChatTemplate(src)
    except TemplateError:
        return None


def _detect_kind(src: str, known: Callable[[str], bool]) -> str:
    if all(known(m) for m in _HARMONY):
        return "harmony"
    if any(known(m) for m in _GEMMA4):
        return "gemma4"
    if known(_LFM2):
        return "lfm2"
    if all(m in src for m in _DEEPSEEK):
        return "deepseek_v3"
    if all(m in src for m in _QWEN_XML):
        return "qwen_xml"
    if known(_TOOL_CALL) and _has_json_tool_call_body(src):
        return "hermes_json"
    if known(_MISTRAL):
        return "mistral"
    if _LLAMA_CALL.search(_NOISE.sub("", src)):
        return "llama3_json"
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


def _variant(kind: str, src: str, template: ChatTemplate | None, known: Callable[[str], bool]) -> str:
    if kind == "deepseek_v3":
        seps = [m.end() for m in re.finditer(re.escape(DEEPSEEK_SEP), src)]
        return "r1" if any("```json" in src[i: i + _FENCE_WINDOW] for i in seps) else "v3_1"
    if kind == "mistral":  # the template's own calls decide; the vocabulary only when it writes none
        args = MISTRAL_ARGS in src if _MISTRAL in src else known(MISTRAL_ARGS)
        return "args" if args else "json_array"
    if kind == "llama3_json":
        return "semicolon" if _renders_semicolon_calls(template) else "single"
    return ""


def _renders_semicolon_calls(template: ChatTemplate | None) -> bool:
    """Whether the template renders an assistant message with two calls, joined by `;`."""
    if template is None:
        return False
    try:
        text = template.render(_PROBE_TWO_CALLS, tools=_PROBE_TOOLS, add_generation_prompt=False)
    except TemplateError:
        return False
    first, second = text.find("probe_1"), text.find("probe_2")
    return 0 <= first < second and ";" in text[first:second]


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


def _generation_prompt_opens_reasoning(template: ChatTemplate | None, spec: ChatFormatSpec) -> bool:
    if template is None or not spec.reasoning_start:
        return False
    tail = _generation_tail(template)
    if tail is None:
        return False
    opened = tail.rfind(spec.reasoning_start)
    return opened >= 0 and spec.reasoning_end not in tail[opened + len(spec.reasoning_start) :]
