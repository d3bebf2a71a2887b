"""gpt-oss family (gpt-oss-20b / 120b): pre-norm blocks, GQA with q/k/v/o biases and attention sinks,
alternating sliding-window / full layers, YaRN rope, and a routed-expert MLP.

Contract: each block is x + attn(input_norm(x)), then x + experts(post_attn_norm(x)). The experts are
routed by a linear router with bias, the top `num_experts_per_tok` logits softmaxed (`moe.topk_softmax`);
each routed expert computes gate_up = x W_gu + b_gu, whose gate and up halves are interleaved
(gate at even, up at odd columns, as HF stores them), then the clamped SwiGLU
(up.clip(-limit, limit) + 1) * g * sigmoid(alpha g) with g = min(gate, limit), then W_d + b_d; the
outputs are combined with the routing weights (`moe.dispatch` / `expert_matmul` / `combine`: only routed
experts are computed). Expert params carry the logical axis "experts". `hf_entries(cfg)` is the strict
HF tensor table (MXFP4 checkpoints reach it through `mxfp4.fold_mxfp4` under the same names); `HF_CONFIG`
its config.json fields, with transformers' `GptOssConfig` defaults (rope theta 150000, YaRN x32, alternating
layers, the SwiGLU clamp 7.0).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxchat.models import config, moe
from jaxchat.models.config import HF, ModelConfig
from jaxchat.models.entries import Entry
from jaxchat.models.kv import LayerKV
from jaxchat.models.layers import Attention, CausalLM, RMSNorm, param
from jaxchat.models.llama import attention_entries, global_entries

YARN = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
        "original_max_position_embeddings": 4096}
HF_CONFIG = (
    HF("rope_theta", "rope_theta", 150000.0, float),
    HF("rope_scaling", "rope_scaling", YARN, config.rope_scaling),
    HF("attention_bias", "attention_bias", True, bool),
    HF("o_bias", derive=lambda kw, d: kw["attention_bias"]),
    HF("attention_sinks", default=True),
    HF("sliding_window", "sliding_window", conv=int),
    HF("layer_types", "layer_types", conv=tuple, derive=lambda kw, d: [
        "sliding_attention" if i % 2 == 0 else "full_attention" for i in range(kw["num_layers"])]),
    HF("num_experts", "num_local_experts", conv=int),
    HF("num_experts_per_tok", ("num_experts_per_tok", "experts_per_token"), conv=int),
    HF("swiglu_limit", "swiglu_limit", 7.0, float),
    HF("swiglu_alpha", "swiglu_alpha", 1.702, float),
)


class Experts(nnx.Module):
    """Router + routed experts with biases and the clamped SwiGLU."""

    def __init__(self, cfg: ModelConfig, dtype):
        d, f, e = cfg.hidden_size, cfg.intermediate_size, cfg.num_experts
        self.router = param((e, d), ("router", "embed"), dtype)  # HF [E, d]; replicated (small)
        self.router_bias = param((e,), ("router",), dtype)
        self.gate_up = param((e, d, 2 * f), ("experts", "embed", "mlp"), dtype, contract=(1,))  # [E, in, out], gate/up interleaved
        self.gate_up_bias = param((e, 2 * f), ("experts", "mlp"), dtype)
        self.down = param((e, f, d), ("experts", "mlp", "embed"), dtype, contract=(1,))
        self.down_bias = param((e, d), ("experts", "embed"), dtype)
        self.k = cfg.num_experts_per_tok
        self.num_experts = e
        self.limit = cfg.swiglu_limit if cfg.swiglu_limit is not None else 7.0
        self.alpha = cfg.swiglu_alpha

    def __call__(self, x):
        lead, d = x.shape[:-1], x.shape[-1]
        h = x.reshape(-1, d)
        logits = jnp.einsum("nd,ed->ne", h, self.router[...], preferred_element_type=jnp.float32)
        logits = logits + self.router_bias[...].astype(jnp.float32)
        weights, experts = moe.topk_softmax(logits, self.k)
        disp = moe.dispatch(experts, weights, self.num_experts)
        rows = moe.gather_rows(h, disp)
        gu = moe.expert_matmul(rows, self.gate_up[...], disp) + moe.expert_bias(self.gate_up_bias[...], disp)
        gate, up = gu[:, 0::2], gu[:, 1::2]
        gate = jnp.minimum(gate, self.limit)
        up = jnp.clip(up, -self.limit, self.limit)
        act = ((up + 1) * (gate * jax.nn.sigmoid(gate * self.alpha))).astype(h.dtype)
        y = moe.expert_matmul(act, self.down[...], disp) + moe.expert_bias(self.down_bias[...], disp)
        return moe.combine(y, disp, h.shape[0]).reshape(*lead, d)


class GptOssBlock(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype):
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.attn = Attention(cfg, dtype)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.experts = Experts(cfg, dtype)

    def __call__(self, x, rope, positions, cache, kv: LayerKV):
        h, cache = self.attn(self.input_norm(x), rope, positions, cache, kv)
        x = x + h
        x = x + self.experts(self.post_attn_norm(x))
        return x, cache


class Model(CausalLM):
    block_cls = GptOssBlock


def expert_entries(cfg: ModelConfig, i: int) -> list[Entry]:
    d, f, e = cfg.hidden_size, cfg.intermediate_size, cfg.num_experts
    p = f"model.layers.{i}.mlp."
    x = ("layers", "experts")
    return [
        Entry(p + "router.weight", (*x, "router"), i, (e, d), "id"),
        Entry(p + "router.bias", (*x, "router_bias"), i, (e,), "id"),
        Entry(p + "experts.gate_up_proj", (*x, "gate_up"), i, (e, d, 2 * f), "id"),
        Entry(p + "experts.gate_up_proj_bias", (*x, "gate_up_bias"), i, (e, 2 * f), "id"),
        Entry(p + "experts.down_proj", (*x, "down"), i, (e, f, d), "id"),
        Entry(p + "experts.down_proj_bias", (*x, "down_bias"), i, (e, d), "id"),
    ]


def hf_entries(cfg: ModelConfig) -> list[Entry]:
    out = global_entries(cfg)
    d = cfg.hidden_size
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        out += attention_entries(cfg, i, bias=cfg.attention_bias, qk_norm=False)
        if cfg.o_bias:
            out.append(Entry(p + "self_attn.o_proj.bias", ("layers", "attn", "o_bias"), i, (d,), "id"))
        out.append(Entry(p + "self_attn.sinks", ("layers", "attn", "sinks"), i, (cfg.num_heads,), "id"))
        out += expert_entries(cfg, i)
        out += [
            Entry(p + "input_layernorm.weight", ("layers", "input_norm", "scale"), i, (d,), "id"),
            Entry(p + "post_attention_layernorm.weight", ("layers", "post_attn_norm", "scale"), i, (d,), "id"),
        ]
    return out
