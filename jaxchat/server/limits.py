"""Bounds on what one request may carry; every one is checked before the service sees the request.

Contract: `ServerLimits` is a frozen dataclass passed to `create_app` and `serve`. A body over
`max_body_bytes` is refused with 413 before it is parsed; JSON nested deeper than `max_json_depth`
containers, more than `max_messages` messages, more than `max_tools` tools or more than
`max_stop` stop strings are refused with 400 naming the field. `max_tokens_cap` bounds `max_tokens`
when the service's context is unknown (the context itself bounds it otherwise). `shutdown_grace_s`
is how long in-flight requests get to finish after SIGTERM before they are ended with an error.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ServerLimits"]


@dataclass(frozen=True)
class ServerLimits:
    max_body_bytes: int = 4 * 1024 * 1024
    max_messages: int = 1024
    max_tools: int = 128
    max_json_depth: int = 100  # above the chat library's 64-level schema bound, so that one names its param
    max_n: int = 16
    max_stop: int = 4
    max_top_logprobs: int = 20
    max_tokens_cap: int = 1 << 20
    max_prompt_items: int = 1  # /v1/completions: how many prompts one request may batch
    shutdown_grace_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_messages", "max_tools", "max_json_depth", "max_n", "max_tokens_cap"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerLimits.{name} must be at least 1, got {getattr(self, name)}")
        if self.shutdown_grace_s < 0:
            raise ValueError("ServerLimits.shutdown_grace_s must not be negative")
