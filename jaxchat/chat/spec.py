"""Chat format specs: which markers a model family uses for reasoning, tool calls and stops.

Contract: a `ChatFormatSpec` is a frozen value built only by `chat_format_make(kind, ...)`.
Both the parser (`chat.parse`) and the grammar (`constrain`) read their markers from it,
so they cannot disagree about the syntax. Kinds with more than one tool-call syntax name theirs in
`spec.variant` (`VARIANTS`; the first is the default): `llama3_json` "single" (one call per turn)
or "semicolon" (calls joined by `;`), `mistral` "args" (`[TOOL_CALLS]name[ARGS]{...}`) or
"json_array" (`[TOOL_CALLS][{"name": ..., "arguments": ...}]`), `deepseek_v3` "r1"
(`function<｜tool▁sep｜>NAME` + a ```json fence) or "v3_1" (`NAME<｜tool▁sep｜>{...}`). The
markers inside a call that both consumers need are the `DEEPSEEK_*` and `MISTRAL_*` constants.

Call envelopes (`chat.envelopes`, `constrain.tags_envelopes`): the JSON-call kinds also read calls
written the way small models write them, as fenced or bare JSON in the content. `spec.envelopes`
names the shapes a spec accepts (`ENVELOPES`: "fenced", a Markdown code fence; "bare", an object or
array opening a line); a call object in an envelope opens with `{`, whitespace, then one of
`ENVELOPE_NAME_KEYS` written exactly, a declared tool's name and `"`, then `"arguments"` or
`"parameters"` (`ENVELOPE_ARGUMENT_KEYS`) and an object. The grammar triggers on exactly those
name keys, so what the parser reads as an envelope call is what the grammar constrains.
"""

from __future__ import annotations

from dataclasses import dataclass

FORMAT_KINDS = ("plain", "hermes_json", "qwen_xml", "lfm2", "gemma4", "harmony", "llama3_json", "mistral", "deepseek_v3")

VARIANTS: dict[str, tuple[str, ...]] = {
    "llama3_json": ("single", "semicolon"),
    "mistral": ("args", "json_array"),
    "deepseek_v3": ("r1", "v3_1"),
}

DEEPSEEK_CALL_BEGIN = "<｜tool▁call▁begin｜>"
DEEPSEEK_CALL_END = "<｜tool▁call▁end｜>"
DEEPSEEK_SEP = "<｜tool▁sep｜>"
MISTRAL_ARGS = "[ARGS]"
MISTRAL_CALL_ID = "[CALL_ID]"

ENVELOPE_SHAPES = ("fenced", "bare")
# (kind, variant) -> the envelope shapes it reads: the kinds whose calls are {"name", "arguments"} objects
ENVELOPES: dict[tuple[str, str], tuple[str, ...]] = {
    ("hermes_json", ""): ENVELOPE_SHAPES,
    ("llama3_json", "single"): ENVELOPE_SHAPES,
    ("llama3_json", "semicolon"): ENVELOPE_SHAPES,
    ("mistral", "json_array"): ENVELOPE_SHAPES,
}
ENVELOPE_NAME_KEYS = ('"name": "', '"name":"')
ENVELOPE_ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass(frozen=True)
class ChatFormatSpec:
    kind: str = "plain"
    reasoning: bool = False
    reasoning_forced: bool = False
    reasoning_start: str = ""
    reasoning_end: str = ""
    tool_start: str = ""
    tool_end: str = ""
    stop_markers: tuple[str, ...] = ()
    extra_stops: tuple[str, ...] = ()
    variant: str = ""
    envelopes: tuple[str, ...] = ()  # call envelope shapes read besides the format's own call syntax

    def __str__(self) -> str:
        name = f"{self.kind}:{self.variant}" if self.variant else self.kind
        if self.reasoning_forced:
            return f"{name} with forced reasoning"
        if self.reasoning:
            return f"{name} with reasoning"
        return name

    @property
    def has_tools(self) -> bool:
        return self.kind != "plain"


_THINK = ("<think>", "</think>")

# kind -> (reasoning_start, reasoning_end, tool_start, tool_end, stop_markers, extra_stops)
_MARKERS: dict[str, tuple[str, str, str, str, tuple[str, ...], tuple[str, ...]]] = {
    "plain": (*_THINK, "", "", ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<end_of_turn>"), ()),
    "hermes_json": (*_THINK, "<tool_call>", "</tool_call>", ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"), ()),
    "qwen_xml": (*_THINK, "<tool_call>", "</tool_call>", ("<|im_end|>", "<|endoftext|>"), ()),
    "lfm2": (*_THINK, "<|tool_call_start|>", "<|tool_call_end|>", ("<|im_end|>", "<|endoftext|>"), ()),
    "gemma4": ("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", ("<turn|>", "<|tool_response>"), ("<|tool_response>",)),
    "harmony": ("<|channel|>analysis<|message|>", "<|end|>", " to=functions.", "<|call|>", ("<|return|>",), ("<|call|>",)),
    # Calls end with their own syntax (no tool_end): a bare JSON call opens the turn, or follows <|python_tag|>.
    "llama3_json": (*_THINK, "<|python_tag|>", "", ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"), ("<|eom_id|>", "<|eot_id|>")),
    "mistral": ("[THINK]", "[/THINK]", "[TOOL_CALLS]", "", ("</s>",), ()),
    "deepseek_v3": (*_THINK, "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", ("<｜end▁of▁sentence｜>",), ()),
}

# Kinds whose reasoning markers are fixed by the format rather than by `<think>` being known.
INTRINSIC_REASONING = frozenset({"gemma4", "harmony"})


def reasoning_markers(kind: str) -> tuple[str, str]:
    """The reasoning block markers of `kind` (whether or not a model of that kind reasons)."""
    return _MARKERS[kind][0], _MARKERS[kind][1]


def chat_format_make(kind: str, reasoning: bool = False, reasoning_forced: bool = False, variant: str = "") -> ChatFormatSpec:
    """Build the spec of `kind`; reasoning markers are kept only when `reasoning` is true; `variant`
    picks the tool-call syntax of kinds that have several ("" for the default)."""
    if kind not in _MARKERS:
        raise ValueError(f"unknown chat format kind {kind!r}; known: {', '.join(FORMAT_KINDS)}")
    variants = VARIANTS.get(kind, ("",))
    variant = variant or variants[0]
    if variant not in variants:
        raise ValueError(f"unknown variant {variant!r} of chat format {kind}; known: {', '.join(variants)}")
    r_start, r_end, t_start, t_end, stops, extra = _MARKERS[kind]
    reasoning = reasoning or reasoning_forced or kind in INTRINSIC_REASONING
    if not reasoning:
        r_start = r_end = ""
    return ChatFormatSpec(
        kind=kind,
        reasoning=reasoning,
        reasoning_forced=reasoning_forced and reasoning,
        reasoning_start=r_start,
        reasoning_end=r_end,
        tool_start=t_start,
        tool_end=t_end,
        stop_markers=stops,
        extra_stops=extra,
        variant=variant,
        envelopes=ENVELOPES.get((kind, variant), ()),
    )
