"""Qwen2 / Qwen2.5 family: the Llama block with q/k/v projection biases (`attention_bias=True`).

Contract: same forward as `jaxchat.models.llama`; `hf_entries` adds the three bias tensors per layer.
"""

from __future__ import annotations

from jaxchat.models.layers import CausalLM
from jaxchat.models.llama import LlamaBlock, hf_entries  # noqa: F401  (the table follows the config flags)


class Model(CausalLM):
    block_cls = LlamaBlock
