"""Qwen3.5-MoE (text decoder): the Qwen3.5 hybrid (`qwen3_5_text`) whose every feed-forward is routed experts
with a shared expert (`qwen3_next.SparseMoE`, top-k always renormalised).

Contract: `Model` and `hf_entries(cfg)` as every family module; the shared layers live in `qwen3_next`.
"""

from __future__ import annotations

from jaxchat.models import qwen3_next
from jaxchat.models.config import ModelConfig
from jaxchat.models.entries import Entry

hf_tensors = qwen3_next.hf_tensors


class Model(qwen3_next.Model):
    grouped = False
    routed = True

    @classmethod
    def routes(cls, cfg: ModelConfig, i: int) -> bool:
        return True


def hf_entries(cfg: ModelConfig) -> list[Entry]:
    return qwen3_next.hybrid_entries(cfg, Model)
