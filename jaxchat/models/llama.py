"""Llama family (Llama 3.x incl. its rope scaling, SmolLM2): pre-norm blocks, GQA, SwiGLU.

Contract: `LlamaBlock` is the shared pre-norm block (x + attn(norm(x)); x + mlp(norm(x))) that the
qwen2 (q/k/v bias) and qwen3 (q/k norm) families reuse through config flags; `Model` is the causal
LM; `hf_entries(cfg)` is the strict HF tensor-name table (name -> param path, HF shape, converter);
`HF_CONFIG` its config.json fields beyond `config.SHARED` (none but a check); `GGUF_ARCH` its llama.cpp name.
"""

from __future__ import annotations

from flax import nnx

from jaxchat.models.config import HF, ModelConfig
from jaxchat.models.entries import Entry
from jaxchat.models.kv import LayerKV
from jaxchat.models.layers import MLP, Attention, CausalLM, RMSNorm

HF_CONFIG = (HF(None, "mlp_bias"),)  # the shared fields; MLP biases are not supported
GGUF_ARCH = "llama"


class LlamaBlock(nnx.Module):
    mlp_cls: type = MLP  # the feed-forward built as mlp_cls(cfg, dtype) (qwen3_moe: its routed experts)

    def __init__(self, cfg: ModelConfig, dtype):
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.attn = Attention(cfg, dtype)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = self.mlp_cls(cfg, dtype)

    def __call__(self, x, rope, positions, cache, kv: LayerKV):
        h, cache = self.attn(self.input_norm(x), rope, positions, cache, kv)
        x = x + h
        x = x + self.mlp(self.post_attn_norm(x))
        return x, cache


class Model(CausalLM):
    block_cls = LlamaBlock


def attention_entries(cfg: ModelConfig, i: int, *, bias: bool, qk_norm: bool) -> list[Entry]:
    d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    g = h // kv
    p = f"model.layers.{i}.self_attn."
    out = [
        Entry(p + "q_proj.weight", ("layers", "attn", "qkv"), i, (h * hd, d), "in_heads", part=(2, 0, g)),
        Entry(p + "k_proj.weight", ("layers", "attn", "qkv"), i, (kv * hd, d), "in_heads", part=(2, g, g + 1)),
        Entry(p + "v_proj.weight", ("layers", "attn", "qkv"), i, (kv * hd, d), "in_heads", part=(2, g + 1, g + 2)),
        Entry(p + "o_proj.weight", ("layers", "attn", "o"), i, (d, h * hd), "out_heads"),
    ]
    if bias:
        out += [
            Entry(p + "q_proj.bias", ("layers", "attn", "qkv_bias"), i, (h * hd,), "bias_heads", part=(1, 0, g)),
            Entry(p + "k_proj.bias", ("layers", "attn", "qkv_bias"), i, (kv * hd,), "bias_heads", part=(1, g, g + 1)),
            Entry(p + "v_proj.bias", ("layers", "attn", "qkv_bias"), i, (kv * hd,), "bias_heads",
                  part=(1, g + 1, g + 2)),
        ]
    if qk_norm:
        out += [
            Entry(p + "q_norm.weight", ("layers", "attn", "q_norm", "scale"), i, (hd,), "id"),
            Entry(p + "k_norm.weight", ("layers", "attn", "k_norm", "scale"), i, (hd,), "id"),
        ]
    return out


def mlp_entries(cfg: ModelConfig, i: int) -> list[Entry]:
    d, f = cfg.hidden_size, cfg.intermediate_size
    p = f"model.layers.{i}.mlp."
    return [
        Entry(p + "gate_proj.weight", ("layers", "mlp", "gate_up"), i, (f, d), "id", part=(0, 0, 1)),
        Entry(p + "up_proj.weight", ("layers", "mlp", "gate_up"), i, (f, d), "id", part=(0, 1, 2)),
        Entry(p + "down_proj.weight", ("layers", "mlp", "down"), i, (d, f), "id"),
    ]


def global_entries(cfg: ModelConfig, final_norm: str = "model.norm.weight") -> list[Entry]:
    out = [
        Entry("model.embed_tokens.weight", ("embed",), None, (cfg.vocab_size, cfg.hidden_size), "t"),
        Entry(final_norm, ("final_norm", "scale"), None, (cfg.hidden_size,), "id"),
    ]
    if not cfg.tie_word_embeddings:
        out.append(Entry("lm_head.weight", ("lm_head",), None, (cfg.vocab_size, cfg.hidden_size), "t"))
    return out


def hf_entries(cfg: ModelConfig) -> list[Entry]:
    out = global_entries(cfg)
    for i in range(cfg.num_layers):
        out += attention_entries(cfg, i, bias=cfg.attention_bias, qk_norm=cfg.qk_norm)
        out += mlp_entries(cfg, i)
        out += [
            Entry(f"model.layers.{i}.input_layernorm.weight", ("layers", "input_norm", "scale"), i,
                  (cfg.hidden_size,), "id"),
            Entry(f"model.layers.{i}.post_attention_layernorm.weight", ("layers", "post_attn_norm", "scale"), i,
                  (cfg.hidden_size,), "id"),
        ]
    return out
