"""Qwen3.5-MoE (text decoder): the Qwen3.5 hybrid (`qwen3_5_text`) whose every feed-forward is routed experts
with a shared expert (`qwen3_next.SparseMoE`, top-k always renormalised).

Contract: `Model`, `hf_entries(cfg)` and `HF_CONFIG` as every family module; the shared layers live in `qwen3_next`.
"""

from __future__ import annotations

from jaxchat.models import qwen3_next
from jaxchat.models.config import HF, ModelConfig
from jaxchat.models.entries import Entry

hf_tensors = qwen3_next.hf_tensors
HF_CONFIG = (*qwen3_next.HYBRID_CONFIG, *qwen3_next.ROUTED, HF("norm_topk_prob", default=True),
             HF("intermediate_size", ("intermediate_size", "moe_intermediate_size"), conv=int))
hf_config_read = qwen3_next.hf_config_read


class Model(qwen3_next.Model):
    grouped = False
    routed = True

    @classmethod
    def routes(cls, cfg: ModelConfig, i: int) -> bool:
        return True


def hf_entries(cfg: ModelConfig) -> list[Entry]:
    return qwen3_next.hybrid_entries(cfg, Model)
