"""Gemma 3 (text) family: sliding-window and global layers, the (1 + w) norm, embedding scale.

Contract: each block is x + post_attn_norm(attn(input_norm(x))), then
x + post_ffw_norm(mlp(pre_ffw_norm(x))), with GeGLU (gelu tanh), per-head q/k Gemma norms, an
attention scale of query_pre_attn_scalar ** -0.5, sliding layers using rope_local_base_freq and a
window (p > q - sliding_window), global layers using rope_theta (+ rope scaling); embeddings are
scaled by sqrt(hidden_size), logits softcapped when `final_logit_softcapping` is set. Norm weights
are the HF ones (w in (1 + w)). `HF_CONFIG` reads the layer types (or every `sliding_window_pattern`-th layer
global, 6 by default, as llama.cpp's GGUFs assume), the window, the local rope theta, the attention scale
(`query_pre_attn_scalar`, head_dim by default) and the softcaps.
"""

from __future__ import annotations

from flax import nnx

from jaxchat.models.config import HF, ModelConfig, whole
from jaxchat.models.entries import Entry
from jaxchat.models.kv import LayerKV
from jaxchat.models.layers import MLP, Attention, CausalLM, RMSNorm
from jaxchat.models.llama import attention_entries, global_entries, mlp_entries


def _every_nth_global(kw: dict, d: dict) -> list[str]:
    n = int(d.get("sliding_window_pattern") or d.get("_sliding_window_pattern") or 6)
    return ["full_attention" if (i + 1) % n == 0 else "sliding_attention" for i in range(kw["num_layers"])]


HF_CONFIG = (
    HF("qk_norm", default=True),
    HF("hidden_act", ("hidden_activation", "hidden_act"), "gelu_pytorch_tanh", str),
    HF("tie_word_embeddings", "tie_word_embeddings", True, bool),
    HF("layer_types", "layer_types", conv=tuple, derive=_every_nth_global),
    HF("sliding_window", "sliding_window", conv=int, gguf="attention.sliding_window"),
    HF("rope_local_base_freq", "rope_local_base_freq", 10000.0, float),
    HF("query_pre_attn_scalar", "query_pre_attn_scalar", conv=float, derive=lambda kw, d: kw["head_dim"], put=whole),
    HF("final_logit_softcapping", "final_logit_softcapping", None, float),
    HF("attn_logit_softcapping", "attn_logit_softcapping", None, float),
)
GGUF_ARCH = "gemma3"

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
