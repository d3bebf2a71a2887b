"""LFM2-MoE (LFM2-8B-A1B): the lfm2 layers (`jaxchat.models.lfm2`) with routed experts after the first
`num_dense_layers` dense SwiGLU layers.

Contract: a MoE layer's feed-forward routes each token with `moe.sigmoid_topk` (sigmoid scores; the
`num_experts_per_tok` experts of largest score + `expert_bias` when `use_expert_bias`, weighted by their
unbiased scores, renormalised when `norm_topk_prob`, times `routed_scaling_factor`) and runs the routed
experts only (`moe.dispatch` / `expert_matmul` / `combine`): silu(x W1) * (x W3) then W2. Expert weights
are kept [experts, in, out] (gate and up [E, hidden, moe_intermediate], down [E, moe_intermediate, hidden]);
the HF table reads the per-expert tensors (`feed_forward.experts.<j>.w1/w2/w3.weight`) transformers saves.
`HF_CONFIG`: lfm2's fields (`layer_types` required, no MLP size adjustment) and the routing ones.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxchat.models import lfm2, moe
from jaxchat.models.config import EXPERTS, HF, REQUIRED, ModelConfig, layer_types_of
from jaxchat.models.entries import Entry
from jaxchat.models.layers import MLP, param
from jaxchat.models.lfm2 import Model as Lfm2Model
from jaxchat.models.lfm2 import global_entries, layer_entries, mlp_entries

HF_CONFIG = (
    *lfm2.HF_CONFIG,
    HF("layer_types", "layer_types", conv=layer_types_of(lfm2.LAYER_TYPES),
       derive=lambda kw, d: REQUIRED if d.get("full_attn_idxs") is None else lfm2.attention_at(kw, d)),
    *EXPERTS,
    HF("norm_topk_prob", "norm_topk_prob", True, bool),
    HF("routed_scaling_factor", "routed_scaling_factor", 1.0, float),
    HF("use_expert_bias", "use_expert_bias", True, bool),
    HF("num_dense_layers", "num_dense_layers", 2, int),
)


class SigmoidMoE(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype):
        e, d, f = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.router = param((d, e), ("embed", "router"), dtype)
        if cfg.use_expert_bias:
            self.expert_bias = param((e,), ("router",), dtype)
        self.gate = param((e, d, f), ("experts", "embed", "mlp"), dtype, contract=(1,))
        self.up = param((e, d, f), ("experts", "embed", "mlp"), dtype, contract=(1,))
        self.down = param((e, f, d), ("experts", "mlp", "embed"), dtype, contract=(1,))
        self.use_bias = cfg.use_expert_bias
        self.k = cfg.num_experts_per_tok
        self.num_experts = e
        self.normalize = cfg.norm_topk_prob
        self.scale = cfg.routed_scaling_factor

    def __call__(self, x):
        lead, d = x.shape[:-1], x.shape[-1]
        xf = x.reshape(-1, d)
        logits = xf @ self.router[...]
        bias = self.expert_bias[...] if self.use_bias else None
        weights, experts = moe.sigmoid_topk(logits, self.k, bias, self.normalize, self.scale)
        disp = moe.dispatch(experts, weights, self.num_experts)
        rows = moe.gather_rows(xf, disp)
        h = jax.nn.silu(moe.expert_matmul(rows, self.gate[...], disp)) * moe.expert_matmul(rows, self.up[...], disp)
        y = moe.expert_matmul(h.astype(x.dtype), self.down[...], disp)
        return moe.combine(y, disp, xf.shape[0]).reshape(*lead, d).astype(jnp.dtype(x.dtype))


class Model(Lfm2Model):
    @classmethod
    def ffn_for(cls, cfg: ModelConfig, i: int, dtype) -> nnx.Module:
        return MLP(cfg, dtype) if i < cfg.num_dense_layers else SigmoidMoE(cfg, dtype)


def moe_entries(cfg: ModelConfig, i: int) -> list[Entry]:
    d, f = cfg.hidden_size, cfg.moe_intermediate_size
    p, at = f"model.layers.{i}.feed_forward.", ("layers", str(i), "feed_forward")
    out = [Entry(p + "gate.weight", (*at, "router"), None, (cfg.num_experts, d), "t")]
    if cfg.use_expert_bias:
        out.append(Entry(p + "expert_bias", (*at, "expert_bias"), None, (cfg.num_experts,), "id"))
    for j in range(cfg.num_experts):
        q, part = f"{p}experts.{j}.", (0, j, j + 1)
        out += [Entry(q + "w1.weight", (*at, "gate"), None, (f, d), "t", part=part),
                Entry(q + "w3.weight", (*at, "up"), None, (f, d), "t", part=part),
                Entry(q + "w2.weight", (*at, "down"), None, (d, f), "t", part=part)]
    return out


def hf_entries(cfg: ModelConfig) -> list[Entry]:
    out = global_entries(cfg)
    for i in range(cfg.num_layers):
        out += layer_entries(cfg, i)
        out += mlp_entries(cfg, i, cfg.intermediate_size) if i < cfg.num_dense_layers else moe_entries(cfg, i)
    return out
