"""Qwen2 / Qwen2.5 family: the Llama block with q/k/v projection biases (`attention_bias=True`).

Contract: same forward as `jaxchat.models.llama`; `hf_entries` adds the three bias tensors per layer;
`HF_CONFIG` states the bias (always on) and the unsupported sliding window.
"""

from __future__ import annotations

from jaxchat.models.config import HF
from jaxchat.models.layers import CausalLM
from jaxchat.models.llama import LlamaBlock, hf_entries  # noqa: F401  (the table follows the config flags)

HF_CONFIG = (HF("attention_bias", default=True), HF(None, "use_sliding_window"))
GGUF_ARCH = "qwen2"


class Model(CausalLM):
    block_cls = LlamaBlock
