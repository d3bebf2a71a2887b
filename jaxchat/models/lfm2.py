"""LFM2 / LFM2.5 (Liquid): gated short causal convolutions interleaved with GQA attention layers.

Contract: layer i is a conv layer or an attention layer as `cfg.layer_types[i]` says ("conv" |
"full_attention"); both are pre-norm blocks, x + op(operator_norm(x)), then x + ffn(ffn_norm(x)), with a
SwiGLU MLP (lfm2_moe: routed experts after its first `num_dense_layers` layers, see `lfm2_moe`). Attention
is `layers.Attention` with per-head q/k RMSNorm and rope; the final norm is HF's `embedding_norm`.

The short conv (`ShortConv`): in_proj -> B, C, x (per channel); u = B * x; a depthwise causal conv of u over
the time axis with window L = `conv_kernel_size`; y = out_proj(C * conv). Its per-row state is the last L-1
inputs u, kept channel-major [slots, hidden, L-1] as the layer's `RecurrentState` (the layer's pool entry;
its channel axis is the one the engine shards, like kv heads). The forward reads and writes the step rows'
state slots (`kv.read_slots`) over a uniform step; a row with a token at position 0 starts from a zero state; tokens
at position -1 (padding) read as zero inputs and never enter the state, which ends at each row's last
valid token. Prefill and decode are the same vectorised code (L shifted products, no loop over tokens).

`HF_CONFIG` reads LFM2's names (`norm_eps`, `conv_L_cache`, the 4.x aliases `block_ff_dim`, `tie_embedding`,
`full_attn_idxs`); `hf_config_read` gives the MLP the size it really has (`block_auto_adjust_ff_dim`: 2/3 of
it, times `block_ffn_dim_multiplier`, rounded up to `block_multiple_of`), so the dict written says
`block_auto_adjust_ff_dim: false`.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from jaxchat.models import llama
from jaxchat.models.base import RecurrentState
from jaxchat.models.config import HF, ModelConfig, layer_types_of
from jaxchat.models.entries import Entry
from jaxchat.models.kv import LayerKV, from_rows, read_slots, to_rows, write_slots
from jaxchat.models.layers import MLP, Attention, CausalLM, RMSNorm, param
from jaxchat.models.llama import attention_entries
from jaxchat.models.quant import qeinsum

LAYER_TYPES = ("conv", "full_attention")


def attention_at(kw: dict, d: dict) -> list[str]:  # 4.x: full_attn_idxs (default: every layer attention)
    idxs = d.get("full_attn_idxs")
    idxs = range(kw["num_layers"]) if idxs is None else idxs
    return ["full_attention" if i in idxs else "conv" for i in range(kw["num_layers"])]


HF_CONFIG = (
    HF("intermediate_size", ("block_ff_dim", "intermediate_size"), conv=int, out="intermediate_size"),
    HF("rms_norm_eps", ("norm_eps", "rms_norm_eps"), 1e-5, float),
    HF("rope_theta", "rope_theta", 1000000.0, float),
    HF("max_position_embeddings", "max_position_embeddings", 128000, int),
    HF("tie_word_embeddings", ("tie_embedding", "tie_word_embeddings"), True, bool, out="tie_word_embeddings"),
    HF("hidden_act", default="silu"),
    HF("qk_norm", default=True),
    HF("layer_types", "layer_types", conv=layer_types_of(LAYER_TYPES), derive=attention_at),
    HF("conv_kernel_size", "conv_L_cache", 3, int),
    HF("conv_bias", "conv_bias", False, bool),
)


def hf_config_read(d: dict, kw: dict) -> None:
    if d.get("block_auto_adjust_ff_dim", True):  # the size the MLP really has
        ff = int(2 * kw["intermediate_size"] / 3)
        mult = d.get("block_ffn_dim_multiplier", 1.0)
        if mult is not None:
            ff = int(mult * ff)
            step = int(d.get("block_multiple_of", 256))
            ff = step * ((ff + step - 1) // step)
        kw["intermediate_size"] = ff


def hf_config_write(cfg: ModelConfig, d: dict) -> None:
    d["block_auto_adjust_ff_dim"] = False  # intermediate_size is the real one


def is_attention(cfg: ModelConfig, i: int) -> bool:
    return cfg.layer_types[i] != "conv"


class ShortConv(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype):
        d, k = cfg.hidden_size, cfg.conv_kernel_size
        self.in_proj = param((d, 3, d), ("embed", "conv_parts", "conv_dim"), dtype, contract=(0,))  # B, C, x per channel
        self.conv = param((d, 1, k), ("conv_dim", "conv_one", "conv_window"), dtype)  # HF's depthwise layout
        self.out_proj = param((d, d), ("conv_dim", "embed"), dtype, contract=(0,))
        if cfg.conv_bias:
            self.in_bias = param((3, d), ("conv_parts", "conv_dim"), dtype)
            self.conv_bias = param((d,), ("conv_dim",), dtype)
            self.out_bias = param((d,), ("embed",), dtype)
        self.has_bias = cfg.conv_bias
        self.window = k

    def __call__(self, x, state_all, kv: LayerKV):
        """x [1, T, d] (a uniform step, `kv.to_rows`); state_all: every slot's conv inputs [slots, d, L-1] ->
        (y [1, T, d], state_all with the rows' new states)."""
        x, positions = to_rows(x, kv), to_rows(kv.inputs.positions[None], kv)
        b, t = positions.shape
        k = self.window
        valid = positions >= 0
        h = qeinsum("btd,dpc->btpc", x, self.in_proj[...])
        if self.has_bias:
            h = h + self.in_bias[...]
        gate_b, gate_c, xs = h[:, :, 0], h[:, :, 1], h[:, :, 2]
        u = jnp.where(valid[..., None], gate_b * xs, 0).astype(x.dtype)  # padding: zero input
        own = read_slots(state_all, kv)
        fresh = jnp.any(positions == 0, axis=1)  # the row (re)starts here: no state from before
        own = jnp.where(fresh[:, None, None], jnp.zeros((), own.dtype), own)
        seq = jnp.concatenate([jnp.swapaxes(own, 1, 2).astype(u.dtype), u], axis=1)  # [B, L-1+T, d]
        w = self.conv[...][:, 0, :]  # [d, L]
        out = sum(seq[:, j:j + t, :] * w[:, j] for j in range(k))
        if self.has_bias:
            out = out + self.conv_bias[...]
        y = qeinsum("btc,cd->btd", (gate_c * out).astype(x.dtype), self.out_proj[...])
        if self.has_bias:
            y = y + self.out_bias[...]
        # the new state: the L-1 inputs ending at each row's last valid token (none: the old state)
        last = jnp.max(jnp.where(valid, jnp.arange(t, dtype=jnp.int32)[None], -1), axis=1)
        idx = last[:, None] + 1 + jnp.arange(k - 1, dtype=jnp.int32)[None]  # indices into seq
        new = jnp.swapaxes(jnp.take_along_axis(seq, idx[:, :, None], axis=1), 1, 2)
        return from_rows(y), write_slots(state_all, new, kv)


class Lfm2Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype, attention: bool, ffn: nnx.Module):
        d, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.operator_norm = RMSNorm(d, eps, dtype)
        if attention:
            self.attn = Attention(cfg, dtype)
        else:
            self.conv = ShortConv(cfg, dtype)
        self.ffn_norm = RMSNorm(d, eps, dtype)
        self.feed_forward = ffn
        self.attention = attention

    def __call__(self, x, rope, positions, cache, kv: LayerKV):
        h = self.operator_norm(x)
        if self.attention:
            h, cache = self.attn(h, rope, positions, cache, kv)
        else:
            (state,) = cache
            h, state = self.conv(h, state, kv)
            cache = (state,)
        x = x + h
        x = x + self.feed_forward(self.ffn_norm(x))
        return x, cache


class Model(CausalLM):
    stacked = False

    @classmethod
    def ffn_for(cls, cfg: ModelConfig, i: int, dtype) -> nnx.Module:
        return MLP(cfg, dtype)

    @classmethod
    def block_for(cls, cfg: ModelConfig, i: int, dtype) -> nnx.Module:
        return Lfm2Block(cfg, dtype, is_attention(cfg, i), cls.ffn_for(cfg, i, dtype))

    @classmethod
    def cache_dims(cls, cfg: ModelConfig):
        conv = RecurrentState(((cfg.hidden_size, cfg.conv_kernel_size - 1),))
        return tuple((cfg.num_kv_heads, cfg.head_dim) if is_attention(cfg, i) else conv for i in range(cfg.num_layers))


ATTN_NAMES = {"o_proj": "out_proj", "q_norm": "q_layernorm", "k_norm": "k_layernorm"}  # ours (llama) -> HF


def _rename(e: Entry, names: dict[str, str]) -> Entry:
    from dataclasses import replace

    parts = e.hf.split(".")
    return replace(e, hf=".".join(names.get(p, p) for p in parts))


def layer_entries(cfg: ModelConfig, i: int) -> list[Entry]:
    """Layer i's operator (conv or attention) and norms, in listed form (paths ("layers", "<i>", ...))."""
    d = cfg.hidden_size
    p, at = f"model.layers.{i}.", ("layers", str(i))
    out = [Entry(p + "operator_norm.weight", (*at, "operator_norm", "scale"), None, (d,), "id"),
           Entry(p + "ffn_norm.weight", (*at, "ffn_norm", "scale"), None, (d,), "id")]
    if is_attention(cfg, i):
        for e in attention_entries(cfg, i, bias=False, qk_norm=True):
            out.append(_rename(Entry(e.hf, (*at, *e.path[1:]), None, e.hf_shape, e.convert, e.part), ATTN_NAMES))
        return out
    k = cfg.conv_kernel_size
    out += [Entry(p + "conv.in_proj.weight", (*at, "conv", "in_proj"), None, (3 * d, d), "in_heads"),
            Entry(p + "conv.conv.weight", (*at, "conv", "conv"), None, (d, 1, k), "id"),
            Entry(p + "conv.out_proj.weight", (*at, "conv", "out_proj"), None, (d, d), "t")]
    if cfg.conv_bias:
        out += [Entry(p + "conv.in_proj.bias", (*at, "conv", "in_bias"), None, (3 * d,), "bias_heads"),
                Entry(p + "conv.conv.bias", (*at, "conv", "conv_bias"), None, (d,), "id"),
                Entry(p + "conv.out_proj.bias", (*at, "conv", "out_bias"), None, (d,), "id")]
    return out


def mlp_entries(cfg: ModelConfig, i: int, f: int) -> list[Entry]:
    d, p, at = cfg.hidden_size, f"model.layers.{i}.feed_forward.", ("layers", str(i), "feed_forward")
    return [Entry(p + "w1.weight", (*at, "gate_up"), None, (f, d), "id", part=(0, 0, 1)),
            Entry(p + "w3.weight", (*at, "gate_up"), None, (f, d), "id", part=(0, 1, 2)),
            Entry(p + "w2.weight", (*at, "down"), None, (d, f), "id")]


def global_entries(cfg: ModelConfig) -> list[Entry]:
    return llama.global_entries(cfg, final_norm="model.embedding_norm.weight")  # LFM2 names its final norm so


def hf_entries(cfg: ModelConfig) -> list[Entry]:
    out = global_entries(cfg)
    for i in range(cfg.num_layers):
        out += layer_entries(cfg, i) + mlp_entries(cfg, i, cfg.intermediate_size)
    return out
