"""Gemma 3 (text) family: sliding-window and global layers, the (1 + w) norm, embedding scale.

Contract: each block is x + post_attn_norm(attn(input_norm(x))), then
x + post_ffw_norm(mlp(pre_ffw_norm(x))), with GeGLU (gelu tanh), per-head q/k Gemma norms, an
attention scale of query_pre_attn_scalar ** -0.5, sliding layers using rope_local_base_freq and a
window (p > q - sliding_window), global layers using rope_theta (+ rope scaling); embeddings are
scaled by sqrt(hidden_size), logits softcapped when `final_logit_softcapping` is set. Norm weights
are the HF ones (w in (1 + w)).
"""

from __future__ import annotations

from flax import nnx

from jaxchat.models.config import ModelConfig
from jaxchat.models.entries import Entry
from jaxchat.models.kv import LayerKV
from jaxchat.models.layers import MLP, Attention, CausalLM, RMSNorm
from jaxchat.models.llama import attention_entries, global_entries, mlp_entries

NORMS = {  # HF name -> param name
    "input_layernorm": "input_norm",
    "post_attention_layernorm": "post_attn_norm",
    "pre_feedforward_layernorm": "pre_ffw_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


class GemmaBlock(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype):
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_norm = RMSNorm(d, eps, dtype, gemma=True)
        self.attn = Attention(cfg, dtype, gemma_norm=True)
        self.post_attn_norm = RMSNorm(d, eps, dtype, gemma=True)
        self.pre_ffw_norm = RMSNorm(d, eps, dtype, gemma=True)
        self.mlp = MLP(cfg, dtype)
        self.post_ffw_norm = RMSNorm(d, eps, dtype, gemma=True)

    def __call__(self, x, rope, positions, cache, kv: LayerKV):
        h, cache = self.attn(self.input_norm(x), rope, positions, cache, kv)
        x = x + self.post_attn_norm(h)
        x = x + self.post_ffw_norm(self.mlp(self.pre_ffw_norm(x)))
        return x, cache


class Model(CausalLM):
    block_cls = GemmaBlock
    gemma = True


def hf_entries(cfg: ModelConfig) -> list[Entry]:
    out = global_entries(cfg)
    for i in range(cfg.num_layers):
        out += attention_entries(cfg, i, bias=cfg.attention_bias, qk_norm=True)
        out += mlp_entries(cfg, i)
        out += [Entry(f"model.layers.{i}.{hf}.weight", ("layers", ours, "scale"), i, (cfg.hidden_size,), "id")
                for hf, ours in NORMS.items()]
    return out
