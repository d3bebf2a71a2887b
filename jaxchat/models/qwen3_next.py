"""Qwen3-Next, and the shared code of the Gated DeltaNet hybrids (`qwen3_5_text`, `qwen3_5_moe` are thin
modules on it): per `layer_types`, Gated DeltaNet linear attention (`deltanet`) or gated full attention,
each followed by a dense MLP or routed experts with a shared expert.

Contract:
- Blocks: x + mixer(input_norm(x)); x + ffn(post_attn_norm(x)), every RMSNorm of the block, the q/k norms
  and the final norm scaling by (1 + w) (HF's zero-centred weights); the gated RMSNorm of DeltaNet by w.
- Gated attention: q_proj gives per head [query, gate]; q/k RMSNorm per head, rope on the first
  head_dim * partial_rotary_factor dims (half-split layout), GQA over the step's paged attention (`layers.attend`),
  scale head_dim ** -0.5, the output times sigmoid(gate) before o_proj.
- Routed experts (`SparseMoE`): softmax top-k (renormalised if `norm_topk_prob`) through `moe`, plus a shared
  gated MLP scaled by sigmoid(shared_expert_gate(x)). A layer is routed when the family routes
  (`Model.routed`) and, for qwen3_next, i is not in `mlp_only_layers` and (i + 1) % decoder_sparse_step == 0.
- `Model` is a listed `CausalLM`; `cache_dims` gives full attention layers (kv heads, head dim) and DeltaNet
  layers their float32 `RecurrentState` (conv window, matrix state). `hf_entries(cfg)` is the strict
  table of HF names with the experts stacked as Qwen3.5-MoE checkpoints ship them; `hf_tensors` (which the
  loader applies first, re-exported by the thin family modules) renames a multimodal checkpoint's
  "model.language_model." tensors, skips "mtp." and "model.visual." ones and fuses per-expert tensors
  (transformers' `save_pretrained`, Qwen3-Next checkpoints) into the stacked form.
- config.json: `HYBRID_CONFIG` the fields every hybrid reads (layer types, or every
  `full_attention_interval`-th layer full; the DeltaNet sizes; partial rotary 0.25 by default),
  `ROUTED` the routed and shared experts; `HF_CONFIG` Qwen3-Next's (which layers route as in qwen3_moe).
"""

from __future__ import annotations

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxchat.models import moe
from jaxchat.models.base import RecurrentState
from jaxchat.models.config import EXPERTS, HF, ModelConfig, ModelLoadError, layer_types_of
from jaxchat.models.deltanet import GatedDeltaNet, state_shapes
from jaxchat.models.entries import Entry, listed
from jaxchat.models.kv import LayerKV
from jaxchat.models.layers import (
    MLP,
    CausalLM,
    RMSNorm,
    apply_rope,
    attend,
    param,
    rope_inv_freq,
    rope_tables,
)
from jaxchat.models.llama import global_entries, mlp_entries
from jaxchat.models.quant import qeinsum
from jaxchat.models.qwen3_moe import SPARSE_LAYERS

HYBRID_CONFIG = (
    HF("qk_norm", default=True),
    HF(None, "attention_bias"),
    HF("partial_rotary_factor", "partial_rotary_factor", 0.25, float),
    HF("layer_types", "layer_types", conv=layer_types_of(("linear_attention", "full_attention")),
       derive=lambda kw, d: ["linear_attention" if (i + 1) % int(d.get("full_attention_interval") or 4)
                             else "full_attention" for i in range(kw["num_layers"])]),
    *(HF(k, k, conv=int) for k in ("linear_key_head_dim", "linear_value_head_dim", "linear_num_key_heads",
                                  "linear_num_value_heads")),
    HF("linear_conv_kernel_dim", "linear_conv_kernel_dim", 4, int),
)
ROUTED = (*EXPERTS, HF("shared_expert_intermediate_size", "shared_expert_intermediate_size", conv=int))
HF_CONFIG = (*HYBRID_CONFIG, *ROUTED, HF("norm_topk_prob", "norm_topk_prob", True, bool), *SPARSE_LAYERS)


def hf_config_read(d: dict, kw: dict) -> None:
    if kw["linear_num_value_heads"] % kw["linear_num_key_heads"]:
        raise ModelLoadError("config.json: linear_num_key_heads does not divide linear_num_value_heads")


HF_RENAMES = {"model.language_model.": "model."}  # Qwen3.5's multimodal checkpoints: the text decoder's tensors
HF_SKIPPED = ("mtp.", "model.visual.")  # multi-token-prediction heads and the vision tower: not loaded


def rotary_dim(cfg: ModelConfig) -> int:
    return int(cfg.head_dim * cfg.partial_rotary_factor)


class GatedAttention(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype):
        d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q = param((d, 2 * h, hd), ("embed", "heads", "head_dim"), dtype, contract=(0,))  # per head: query, gate
        self.k = param((d, kv, hd), ("embed", "kv_heads", "head_dim"), dtype, contract=(0,))
        self.v = param((d, kv, hd), ("embed", "kv_heads", "head_dim"), dtype, contract=(0,))
        self.o = param((h, hd, d), ("heads", "head_dim", "embed"), dtype, contract=(0, 1))
        self.q_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype, gemma=True)
        self.k_norm = RMSNorm(hd, cfg.rms_norm_eps, dtype, gemma=True)
        self.config = cfg

    def __call__(self, x, positions, cache, kv: LayerKV):
        cfg = self.config
        b, t, _ = x.shape
        h, hd = cfg.num_heads, cfg.head_dim
        qg = qeinsum("btd,dnh->btnh", x, self.q[...]).reshape(b, t, h, 2, hd)
        q, gate = self.q_norm(qg[:, :, :, 0]), qg[:, :, :, 1]
        k = self.k_norm(qeinsum("btd,dnh->btnh", x, self.k[...]))
        v = qeinsum("btd,dnh->btnh", x, self.v[...])
        rd = rotary_dim(cfg)
        cos, sin = rope_tables(positions, rope_inv_freq(rd, cfg.rope_theta, cfg.rope_scaling))
        q = jnp.concatenate([apply_rope(q[..., :rd], cos, sin), q[..., rd:]], axis=-1)
        k = jnp.concatenate([apply_rope(k[..., :rd], cos, sin), k[..., rd:]], axis=-1)
        cache, out = attend(kv, cache, q, k, v, scale=hd ** -0.5)
        out = out.astype(x.dtype) * jax.nn.sigmoid(gate)
        return qeinsum("bthk,hkd->btd", out, self.o[...]), cache


class SparseMoE(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype):
        d, e, f = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
        self.router = param((e, d), ("experts", "embed"), dtype)
        self.gate_up = param((2 * e, d, f), ("experts", "embed", "expert_mlp"), dtype, contract=(1,))  # gates 0..E-1, ups E..2E-1
        self.down = param((e, f, d), ("experts", "expert_mlp", "embed"), dtype, contract=(1,))
        self.shared = MLP(cfg.replace(intermediate_size=cfg.shared_expert_intermediate_size), dtype)
        self.shared_gate = param((1, d), ("norm", "embed"), dtype)
        self.k, self.normalize, self.num_experts = cfg.num_experts_per_tok, cfg.norm_topk_prob, e

    def __call__(self, x):
        lead, d = x.shape[:-1], x.shape[-1]
        xf = x.reshape(-1, d)
        logits = jnp.einsum("nd,ed->ne", xf, self.router[...])
        weights, experts = moe.softmax_topk(logits, self.k, self.normalize)
        disp = moe.dispatch(experts, weights.astype(x.dtype).astype(jnp.float32), self.num_experts)
        rows = moe.gather_rows(xf, disp)
        none = jnp.zeros_like(disp.group_sizes)  # gate and up of expert e are experts e and E + e of gate_up
        gate = disp._replace(group_sizes=jnp.concatenate([disp.group_sizes, none]))
        up = disp._replace(expert=disp.expert + self.num_experts, group_sizes=jnp.concatenate([none, disp.group_sizes]))
        w = self.gate_up[...]
        hid = jax.nn.silu(moe.expert_matmul(rows, w, gate)) * moe.expert_matmul(rows, w, up)
        routed = moe.combine(moe.expert_matmul(hid, self.down[...], disp), disp, xf.shape[0])
        shared = self.shared(xf) * jax.nn.sigmoid(jnp.einsum("nd,od->no", xf, self.shared_gate[...]))
        return (routed + shared).reshape(*lead, d)


class HybridBlock(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype, linear: bool, grouped: bool, routed: bool):
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.input_norm = RMSNorm(d, eps, dtype, gemma=True)
        self.linear = linear
        if linear:
            self.linear_attn = GatedDeltaNet(cfg, dtype, grouped)
        else:
            self.attn = GatedAttention(cfg, dtype)
        self.post_attn_norm = RMSNorm(d, eps, dtype, gemma=True)
        self.mlp = SparseMoE(cfg, dtype) if routed else MLP(cfg, dtype)

    def __call__(self, x, rope, positions, cache, kv: LayerKV):
        h = self.input_norm(x)
        if self.linear:
            h, cache = self.linear_attn(h, cache, kv)
        else:
            h, cache = self.attn(h, positions, cache, kv)
        x = x + h
        return x + self.mlp(self.post_attn_norm(x)), cache


def is_linear(cfg: ModelConfig, i: int) -> bool:
    return cfg.layer_types[i] == "linear_attention"


class Model(CausalLM):
    stacked = False
    grouped = True  # Qwen3-Next's fused in_proj_qkvz / in_proj_ba
    routed = True  # the family has routed experts (layers chosen by `routes`)

    @classmethod
    def routes(cls, cfg: ModelConfig, i: int) -> bool:
        if not cls.routed or cfg.num_experts <= 0:
            return False
        return i not in cfg.mlp_only_layers and (i + 1) % cfg.decoder_sparse_step == 0

    @classmethod
    def block_for(cls, cfg: ModelConfig, i: int, dtype) -> nnx.Module:
        return HybridBlock(cfg, dtype, is_linear(cfg, i), cls.grouped, cls.routes(cfg, i))

    @classmethod
    def cache_dims(cls, cfg: ModelConfig):
        state = RecurrentState(state_shapes(cfg), "float32")
        return tuple(state if is_linear(cfg, i) else (cfg.num_kv_heads, cfg.head_dim) for i in range(cfg.num_layers))

    def __init__(self, cfg: ModelConfig, dtype):
        super().__init__(cfg, dtype)
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, gemma=True)


def attention_entries(cfg: ModelConfig, i: int) -> list[Entry]:
    d, h, kv, hd = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    p, a = f"model.layers.{i}.self_attn.", ("layers", "attn")
    return [
        Entry(p + "q_proj.weight", (*a, "q"), i, (2 * h * hd, d), "in_heads"),
        Entry(p + "k_proj.weight", (*a, "k"), i, (kv * hd, d), "in_heads"),
        Entry(p + "v_proj.weight", (*a, "v"), i, (kv * hd, d), "in_heads"),
        Entry(p + "o_proj.weight", (*a, "o"), i, (d, h * hd), "out_heads"),
        Entry(p + "q_norm.weight", (*a, "q_norm", "scale"), i, (hd,), "id"),
        Entry(p + "k_norm.weight", (*a, "k_norm", "scale"), i, (hd,), "id"),
    ]


def deltanet_entries(cfg: ModelConfig, i: int, grouped: bool) -> list[Entry]:
    d, nk, nv = cfg.hidden_size, cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    conv_dim = 2 * nk * dk + nv * dv
    p, a = f"model.layers.{i}.linear_attn.", ("layers", "linear_attn")
    if grouped:
        out = [Entry(p + "in_proj_qkvz.weight", (*a, "in_qkvz"), i, (2 * nk * dk + 2 * nv * dv, d), "bias_heads"),
               Entry(p + "in_proj_ba.weight", (*a, "in_ba"), i, (2 * nv, d), "bias_heads")]
    else:
        out = [Entry(p + "in_proj_qkv.weight", (*a, "in_qkv"), i, (conv_dim, d), "id"),
               Entry(p + "in_proj_z.weight", (*a, "in_z"), i, (nv * dv, d), "id"),
               Entry(p + "in_proj_b.weight", (*a, "in_b"), i, (nv, d), "id"),
               Entry(p + "in_proj_a.weight", (*a, "in_a"), i, (nv, d), "id")]
    return out + [
        Entry(p + "conv1d.weight", (*a, "conv"), i, (conv_dim, 1, cfg.linear_conv_kernel_dim), "bias_heads"),
        Entry(p + "dt_bias", (*a, "dt_bias"), i, (nv,), "id"),
        Entry(p + "A_log", (*a, "A_log"), i, (nv,), "id"),
        Entry(p + "norm.weight", (*a, "norm"), i, (dv,), "id"),
        Entry(p + "out_proj.weight", (*a, "out"), i, (d, nv * dv), "id"),
    ]


def moe_entries(cfg: ModelConfig, i: int) -> list[Entry]:
    d, e, f = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    p, a = f"model.layers.{i}.mlp.", ("layers", "mlp")
    out = [Entry(p + "gate.weight", (*a, "router"), i, (e, d), "id"),
           Entry(p + "shared_expert_gate.weight", (*a, "shared_gate"), i, (1, d), "id")]
    shared = cfg.replace(intermediate_size=cfg.shared_expert_intermediate_size)
    out += [Entry(x.hf.replace(".mlp.", ".mlp.shared_expert."), (*a, "shared", *x.path[2:]), i, x.hf_shape, x.convert,
                  x.part) for x in mlp_entries(shared, i)]
    return out + [Entry(p + "experts.gate_up_proj", (*a, "gate_up"), i, (e, 2 * f, d), "experts_gate_up_stacked"),
                  Entry(p + "experts.down_proj", (*a, "down"), i, (e, d, f), "experts_t")]


def hf_tensors(cfg: ModelConfig, tensors: dict) -> dict:
    """A checkpoint's tensors under the table's names (`hf_loader` calls it): a multimodal checkpoint's
    "model.language_model." decoder renamed ("model."), "mtp." and "model.visual." tensors left out, and a layer's
    per-expert tensors (experts.<j>.{gate,up,down}_proj.weight, as transformers saves them) fused into the
    stacked experts.gate_up_proj [E, 2f, d] and experts.down_proj [E, d, f] that Qwen3.5-MoE checkpoints ship
    (each read once, when the fused tensor is loaded). A layer whose experts are incomplete keeps its names
    (the strict check then names what is missing)."""
    out = {}
    for name, t in tensors.items():
        if name.startswith(HF_SKIPPED):
            continue
        for old, new in HF_RENAMES.items():
            if name.startswith(old):
                name = new + name[len(old):]
        if name in out:
            raise ModelLoadError(f"tensor {name!r} appears twice (with and without a renamed prefix)")
        out[name] = t
    e = cfg.num_experts
    for i in range(cfg.num_layers if e > 0 else 0):
        p = f"model.layers.{i}.mlp.experts."
        names = {k: [f"{p}{j}.{k}_proj.weight" for j in range(e)] for k in ("gate", "up", "down")}
        if not all(n in out for ns in names.values() for n in ns):
            continue
        parts = {k: [out.pop(n) for n in ns] for k, ns in names.items()}
        g, dn = parts["gate"][0], parts["down"][0]
        out[p + "gate_up_proj"] = replace(g, shape=(e, 2 * g.shape[0], g.shape[1]), load_slice=None, load=_stack(
            [(a, b) for a, b in zip(parts["gate"], parts["up"], strict=True)]))
        out[p + "down_proj"] = replace(dn, shape=(e, *dn.shape), load_slice=None, load=_stack([(x,) for x in parts["down"]]))
    return out


def _stack(groups):
    def load():
        return np.stack([np.concatenate([np.asarray(t.load()) for t in grp], axis=0) for grp in groups])

    return load


def hybrid_entries(cfg: ModelConfig, model_cls) -> list[Entry]:
    out = []
    for i in range(cfg.num_layers):
        out += deltanet_entries(cfg, i, model_cls.grouped) if is_linear(cfg, i) else attention_entries(cfg, i)
        out += moe_entries(cfg, i) if model_cls.routes(cfg, i) else mlp_entries(cfg, i)
        out += [Entry(f"model.layers.{i}.input_layernorm.weight", ("layers", "input_norm", "scale"), i,
                      (cfg.hidden_size,), "id"),
                Entry(f"model.layers.{i}.post_attention_layernorm.weight", ("layers", "post_attn_norm", "scale"), i,
                      (cfg.hidden_size,), "id")]
    return global_entries(cfg) + listed(out)


def hf_entries(cfg: ModelConfig) -> list[Entry]:
    return hybrid_entries(cfg, Model)
