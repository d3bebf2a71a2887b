"""jaxchat: a JAX-native LLM inference engine with an OpenAI-compatible server.

Contract: importing `jaxchat` is cheap (no jax import); `jaxchat.LLM` is resolved lazily.
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "LLM":
        from jaxchat.llm import LLM

        return LLM
    raise AttributeError(f"module 'jaxchat' has no attribute {name!r}")
