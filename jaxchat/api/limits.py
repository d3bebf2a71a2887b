"""`Limits`: every bound on what one request may carry, stated once for the server and `jaxchat.LLM`.

Contract: a frozen dataclass; the HTTP server (`create_app`, `serve`) and the notebook API take the
same object. A body over `max_body_bytes` is refused with 413 before it is parsed (HTTP only); JSON
nested deeper than `max_json_depth` containers (HTTP only), more than `max_messages` messages, more
than `max_tools` tools, a tool or response schema nested deeper than `max_schema_depth` containers,
more than `max_stop` stop strings, `n` above `max_n`, `top_logprobs` above `max_top_logprobs` or a completion's
`logprobs` above `max_completion_logprobs` are refused with 400 naming the field (a body nested too
deeply with a 400 that names no field: it is refused before it is read). `max_tokens_cap` bounds `max_tokens` when the model's context is
unknown (the context itself bounds it otherwise). `shutdown_grace_s` is how long in-flight requests
get to finish after SIGTERM before they are ended with an error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["Limits"]


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 4 * 1024 * 1024
    max_json_depth: int = 100  # above max_schema_depth + 4 (checked), so a deep schema is refused naming its param
    max_messages: int = 1024
    max_tools: int = 128
    # JSON containers (objects and arrays) a schema may nest. OpenAI's own structured-output limit is
    # 10 object levels; with `properties`/`items`/`anyOf` in between that is about 30 containers.
    max_schema_depth: int = 64
    max_n: int = 16
    max_stop: int = 4
    max_top_logprobs: int = 20
    max_completion_logprobs: int = 5  # /v1/completions `logprobs`, as OpenAI bounds it
    max_tokens_cap: int = 1 << 20
    max_prompt_items: int = 1  # /v1/completions: how many prompts one request may batch
    shutdown_grace_s: float = 10.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if name == "shutdown_grace_s":
                if value < 0:
                    raise ValueError(f"Limits.shutdown_grace_s must not be negative, got {value}")
            elif name != "max_stop" and value < 1:
                raise ValueError(f"Limits.{name} must be at least 1, got {value}")
            elif value < 0:
                raise ValueError(f"Limits.{name} must not be negative, got {value}")
        if self.max_json_depth <= self.max_schema_depth + 4:  # a tool schema sits 4 containers deep in a body
            raise ValueError(f"Limits.max_json_depth ({self.max_json_depth}) must exceed max_schema_depth + 4 "
                             f"({self.max_schema_depth + 4}), so that a deep schema is refused naming its param")
