"""Chat format specs: which markers a model family uses for reasoning, tool calls and stops.

Contract: a `ChatFormatSpec` is a frozen value built only by `chat_format_make(kind, ...)`.
Both the parser (`chat.parse`) and the grammar (`constrain`) read their markers from it,
so they cannot disagree about the syntax.
"""

from __future__ import annotations

from dataclasses import dataclass

FORMAT_KINDS = ("plain", "hermes_json", "qwen_xml", "lfm2", "gemma4", "harmony")


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

    def __str__(self) -> str:
        if self.reasoning_forced:
            return f"{self.kind} with forced reasoning"
        if self.reasoning:
            return f"{self.kind} with reasoning"
        return self.kind

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
}

# Kinds whose reasoning markers are fixed by the format rather than by `<think>` being known.
INTRINSIC_REASONING = frozenset({"gemma4", "harmony"})


def chat_format_make(kind: str, reasoning: bool = False, reasoning_forced: bool = False) -> ChatFormatSpec:
    """Build the spec of `kind`; reasoning markers are kept only when `reasoning` is true."""
    if kind not in _MARKERS:
        raise ValueError(f"unknown chat format kind {kind!r}; known: {', '.join(FORMAT_KINDS)}")
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
    )
