"""The prefill: the part of the prompt's tail that the parser and the grammar must see first.

Contract: `chat_format_prefill(spec, prompt_tail)` returns, for tag formats, the opened reasoning
marker with the whitespace after it when the tail opened a reasoning block it did not close (else
`reasoning_start` when reasoning is forced, else ""); for Harmony, everything after the last
`<|start|>` (normally `assistant`).
"""

from __future__ import annotations

from jaxchat.chat.spec import ChatFormatSpec

_HARMONY_START = "<|start|>"


def chat_format_prefill(spec: ChatFormatSpec, prompt_tail: str) -> str:
    if spec.kind == "harmony":
        idx = prompt_tail.rfind(_HARMONY_START)
        return prompt_tail[idx + len(_HARMONY_START):] if idx >= 0 else ""
    if not (spec.reasoning and spec.reasoning_start):
        return ""
    opened = prompt_tail.rfind(spec.reasoning_start)
    if opened >= 0 and prompt_tail.find(spec.reasoning_end, opened) < 0:
        after = prompt_tail[opened + len(spec.reasoning_start):]
        if not after.strip():
            return spec.reasoning_start + after
        return spec.reasoning_start
    if spec.reasoning_forced and opened < 0:
        return spec.reasoning_start
    return ""
