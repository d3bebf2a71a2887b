"""Qwen3 family: the Llama block with a per-head RMSNorm of q and k before rope (`qk_norm=True`).

Contract: same forward as `jaxchat.models.llama`; `hf_entries` adds `q_norm`/`k_norm` per layer; `HF_CONFIG`
states the q/k norm (always on) and the unsupported sliding window.
"""

from __future__ import annotations

from jaxchat.models.config import HF
from jaxchat.models.layers import CausalLM
from jaxchat.models.llama import LlamaBlock, hf_entries  # noqa: F401  (the table follows the config flags)

HF_CONFIG = (HF("qk_norm", default=True), HF(None, "use_sliding_window"))
GGUF_ARCH = "qwen3"


class Model(CausalLM):
    block_cls = LlamaBlock
