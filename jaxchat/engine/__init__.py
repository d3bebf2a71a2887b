"""The engine: jitted prefill/decode steps with the grammar mask applied inside XLA, the sampler,
continuous batching over a fixed set of slots, incremental detokenisation and the async `Engine`.

Contract: callers use `Engine` (or `replicas.from_path`: one engine, or N data-parallel replicas behind the same
interface) and the types in `jaxchat.engine.types` only; see each module's docstring.
"""

from jaxchat.engine.types import (
    Constraint,
    GenerationOutput,
    GenerationRequest,
    SamplingParams,
    TokenLogprob,
)

__all__ = ["Constraint", "Engine", "GenerationOutput", "GenerationRequest", "SamplingParams", "TokenLogprob"]


def __getattr__(name: str):
    if name == "Engine":  # lazy: importing the public types must not import jax
        from jaxchat.engine.engine import Engine

        return Engine
    raise AttributeError(name)
