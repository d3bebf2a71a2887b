"""Qwen3-MoE family (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B / 480B-A35B): the Qwen3 block (q/k norm) with a
routed-experts MLP.

Contract: each sparse layer's MLP routes every token with `gate` (a linear [E, d] router): softmax over
the E experts, the `num_experts_per_tok` largest kept (renormalised to sum 1 when `norm_topk_prob`), and
sums the kept experts' SwiGLU outputs weighted by them (`jaxchat.models.moe`: only the routed experts are
read). Expert params: gate_up [E, d, 2, f] (gate at 0, up at 1; f = moe_intermediate_size) and down
[E, f, d], both with the leading logical axis "experts" (expert parallelism, see `sharding`); the router
[E, d] is replicated. `hf_entries(cfg)` is the per-expert naming of the released checkpoints and of
transformers' `save_pretrained` (`mlp.experts.{j}.gate_proj/up_proj/down_proj.weight`, `mlp.gate.weight`);
`hf_entries_for(cfg, names)` also reads transformers' in-memory fused naming (`mlp.experts.gate_up_proj`
[E, 2f, d], `mlp.experts.down_proj` [E, d, f]), per layer whichever the checkpoint has. When every layer
is sparse the layers are stacked; layers that `mlp_only_layers` / `decoder_sparse_step` make dense (the
Qwen3 SwiGLU MLP of `intermediate_size`) make the model a listed one (`layers.CausalLM`), each layer its
own block and table rows. `HF_CONFIG`: the Qwen3 fields and the experts (`num_experts`, or 5.x's
`num_local_experts`, `num_experts_per_tok`, `moe_intermediate_size`, `norm_topk_prob`, `decoder_sparse_step`,
`mlp_only_layers`).
"""

from __future__ import annotations

from collections.abc import Collection

import jax
import jax.numpy as jnp
from flax import nnx

from jaxchat.models import moe, quant, qwen3
from jaxchat.models.config import EXPERTS, HF, ModelConfig, ints
from jaxchat.models.entries import Entry, listed
from jaxchat.models.layers import CausalLM, param
from jaxchat.models.llama import LlamaBlock, attention_entries, global_entries, mlp_entries

SPARSE_LAYERS = (  # which layers route (`ModelConfig.is_sparse`)
    HF("decoder_sparse_step", "decoder_sparse_step", 1, int),
    HF("mlp_only_layers", "mlp_only_layers", (), ints),
)
HF_CONFIG = (*qwen3.HF_CONFIG, *EXPERTS, HF("num_experts", ("num_experts", "num_local_experts"), conv=int),
             HF("norm_topk_prob", "norm_topk_prob", False, bool), *SPARSE_LAYERS)


class SparseMLP(nnx.Module):
    """Top-k routed SwiGLU experts (softmax over all experts, then top-k)."""

    def __init__(self, cfg: ModelConfig, dtype):
        e, d, f = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.router = param((e, d), ("router", "embed"), dtype)
        self.gate_up = param((e, d, 2, f), ("experts", "embed", "gate_up", "mlp"), dtype, contract=(1,))
        self.down = param((e, f, d), ("experts", "mlp", "embed"), dtype, contract=(1,))
        self.top_k = cfg.num_experts_per_tok
        self.normalize = cfg.norm_topk_prob

    def __call__(self, x):
        lead, dim = x.shape[:-1], x.shape[-1]
        h = x.reshape(-1, dim)
        e, _, _, f = self.gate_up.shape
        logits = jnp.einsum("nd,ed->ne", h, self.router[...])
        weights, experts = moe.softmax_topk(logits, self.top_k, self.normalize)
        weights = weights.astype(x.dtype).astype(jnp.float32)  # the model-dtype weights transformers uses
        d = moe.dispatch(experts, weights, e)
        gate_up = self.gate_up[...]
        gate_up = (gate_up.reshape((e, dim, 2 * f), (e, 1, 2 * f)) if quant.is_quantized(gate_up)
                   else gate_up.reshape(e, dim, 2 * f))
        gu = moe.expert_matmul(moe.gather_rows(h, d), gate_up, d)
        act = jax.nn.silu(gu[:, :f]) * gu[:, f:]
        y = moe.expert_matmul(act, self.down[...], d)
        return moe.combine(y, d, h.shape[0]).reshape(*lead, dim)


class SparseBlock(LlamaBlock):
    """The Qwen3 block with routed experts as its feed-forward."""

    mlp_cls = SparseMLP


class Model(CausalLM):
    """All layers sparse: one stack of `SparseBlock`s. Dense layers among them (`mlp_only_layers`,
    `decoder_sparse_step` > 1): listed layers, each a `SparseBlock` or the dense Qwen3 `LlamaBlock`."""

    block_cls = SparseBlock

    @classmethod
    def is_stacked(cls, cfg: ModelConfig) -> bool:
        return all(cfg.is_sparse)

    @classmethod
    def block_for(cls, cfg: ModelConfig, i: int, dtype) -> nnx.Module:
        return SparseBlock(cfg, dtype) if cfg.is_sparse[i] else LlamaBlock(cfg, dtype)


def _norm_entries(cfg: ModelConfig, i: int) -> list[Entry]:
    d = cfg.hidden_size
    return [
        Entry(f"model.layers.{i}.input_layernorm.weight", ("layers", "input_norm", "scale"), i, (d,), "id"),
        Entry(f"model.layers.{i}.post_attention_layernorm.weight", ("layers", "post_attn_norm", "scale"), i, (d,),
              "id"),
    ]


def expert_entries(cfg: ModelConfig, i: int, fused: bool) -> list[Entry]:
    e, d, f = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
    p = f"model.layers.{i}.mlp."
    out = [Entry(p + "gate.weight", ("layers", "mlp", "router"), i, (e, d), "id")]
    gate_up, down = ("layers", "mlp", "gate_up"), ("layers", "mlp", "down")
    if fused:
        return out + [Entry(p + "experts.gate_up_proj", gate_up, i, (e, 2 * f, d), "experts_gate_up"),
                      Entry(p + "experts.down_proj", down, i, (e, d, f), "experts_t")]
    for j in range(e):
        q = f"{p}experts.{j}."
        out += [Entry(q + "gate_proj.weight", gate_up, i, (f, d), "t", part=(1, 0, 1), expert=j),
                Entry(q + "up_proj.weight", gate_up, i, (f, d), "t", part=(1, 1, 2), expert=j),
                Entry(q + "down_proj.weight", down, i, (d, f), "t", expert=j)]
    return out


def hf_entries_for(cfg: ModelConfig, names: Collection[str] | None = None) -> list[Entry]:
    """The table; a layer whose fused `mlp.experts.gate_up_proj` is among `names` uses the fused naming."""
    out = []
    for i, sparse in enumerate(cfg.is_sparse):
        out += attention_entries(cfg, i, bias=cfg.attention_bias, qk_norm=True)
        if sparse:
            fused = names is not None and f"model.layers.{i}.mlp.experts.gate_up_proj" in names
            out += expert_entries(cfg, i, fused)
        else:
            out += mlp_entries(cfg, i)
        out += _norm_entries(cfg, i)
    return global_entries(cfg) + (out if Model.is_stacked(cfg) else listed(out))


def hf_entries(cfg: ModelConfig) -> list[Entry]:
    return hf_entries_for(cfg)
