"""Qwen2 / Qwen2.5 family: the Llama block with q/k/v projection biases (`attention_bias=True`).

Contract: same forward as `jaxchat.models.llama`; `hf_entries` adds the three bias tensors per layer.
"""

from __future__ import annotations

from jaxchat.models.llama import LlamaBlock, hf_entries  # noqa: F401  (the table follows the config flags)
from jaxchat.models.layers import CausalLM


class Model(CausalLM):
    block_cls = LlamaBlock
