"""Qwen3.5 (text decoder): the Qwen3-Next hybrid (`qwen3_next`) with separate DeltaNet in-projections
(in_proj_qkv, in_proj_z, in_proj_b, in_proj_a) and dense MLPs only.

Contract: `Model`, `hf_entries(cfg)` and `HF_CONFIG` as every family module; the shared layers live in `qwen3_next`.
"""

from __future__ import annotations

from jaxchat.models import qwen3_next
from jaxchat.models.config import ModelConfig
from jaxchat.models.entries import Entry

hf_tensors = qwen3_next.hf_tensors
HF_CONFIG = qwen3_next.HYBRID_CONFIG
hf_config_read = qwen3_next.hf_config_read


class Model(qwen3_next.Model):
    grouped = False
    routed = False


def hf_entries(cfg: ModelConfig) -> list[Entry]:
    return qwen3_next.hybrid_entries(cfg, Model)
