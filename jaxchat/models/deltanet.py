"""Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5): in-projections, a short causal depthwise conv over
q/k/v with its window state, the gated delta rule over a per-head matrix state, and a gated RMSNorm.

Contract:
- `GatedDeltaNet(cfg, dtype, grouped)`: `grouped` is Qwen3-Next's fused in-projections (per key head
  [q, k, v of its value heads, z of its value heads] and [b, a]); otherwise Qwen3.5's separate in_proj_qkv /
  in_proj_z / in_proj_b / in_proj_a. Params keep HF's [out, in] layout (conv weight [conv_dim, kernel]).
- Its per-row state (`state_shapes(cfg)`, a `base.RecurrentState` in float32) is the conv window (the last
  kernel - 1 conv inputs, [K-1, conv_dim]) and the matrix state [value_heads, key_head_dim, value_head_dim].
  The layer's pool entry is (window, matrix) over every state slot; a uniform step's rows read and write
  their own slots (`kv.read_slots`). A row with a token at position 0 in this call starts from a zero state;
  padding tokens (position < 0) neither enter the window nor move the matrix state (their conv input, key,
  beta and log-decay are zeroed: the state passes through unchanged).
- Prefill (T > 1) runs the chunked delta rule (`chunk_delta_rule`: chunks of `CHUNK` tokens, within a
  chunk the UT transform by a unit-lower-triangular solve, a `lax.scan` carrying the state across chunks);
  decode (T == 1) one recurrent step (`recurrent_step`). q and k are L2-normalised, q scaled by
  key_head_dim ** -0.5, each key head serves value_heads / key_heads consecutive value heads; all of it in
  float32 (transformers' `torch_chunk_gated_delta_rule` / `torch_recurrent_gated_delta_rule`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jaxchat.models.config import ModelConfig
from jaxchat.models.kv import LayerKV, from_rows, read_slots, to_rows, write_slots
from jaxchat.models.layers import param
from jaxchat.models.quant import qeinsum

CHUNK = 64
F32 = jnp.float32


def dims(cfg: ModelConfig):
    nk, nv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
    dk, dv = cfg.linear_key_head_dim, cfg.linear_value_head_dim
    return nk, nv, dk, dv, 2 * nk * dk + nv * dv  # the last: conv channels (q, k, v)


def state_shapes(cfg: ModelConfig) -> tuple[tuple[int, ...], ...]:
    nk, nv, dk, dv, conv_dim = dims(cfg)
    return (cfg.linear_conv_kernel_dim - 1, conv_dim), (nv, dk, dv)


def l2norm(x, eps: float = 1e-6):
    return x * jax.lax.rsqrt(jnp.sum(x * x, axis=-1, keepdims=True) + eps)


def causal_conv(x, window, weight, end):
    """Depthwise causal conv: x [B, T, C], window [B, K-1, C] (the inputs before x), weight [C, K] -> the conv
    output [B, T, C] (before the activation) and the new window: the K-1 inputs before index end[b] of x."""
    k, t = weight.shape[1], x.shape[1]
    xx = jnp.concatenate([window, x], axis=1)  # [B, K-1+T, C]
    out = sum(xx[:, i:i + t] * weight[:, i] for i in range(k))
    idx = end[:, None] + jnp.arange(k - 1, dtype=jnp.int32)[None, :]
    return out, jnp.take_along_axis(xx, idx[:, :, None], axis=1)


def recurrent_step(q, k, v, g, beta, state):
    """One token: q, k [B, H, dk], v [B, H, dv], g (log decay), beta [B, H], state [B, H, dk, dv]."""
    state = state * jnp.exp(g)[..., None, None]
    delta = (v - jnp.einsum("bhk,bhkv->bhv", k, state)) * beta[..., None]
    state = state + k[..., :, None] * delta[..., None, :]
    return jnp.einsum("bhk,bhkv->bhv", q, state), state


def chunk_delta_rule(q, k, v, g, beta, state, chunk: int = CHUNK):
    """The gated delta rule over T tokens in chunks: q, k [B, T, H, dk], v [B, T, H, dv], g, beta [B, T, H],
    state [B, H, dk, dv] -> (out [B, T, H, dv], state). Trailing tokens that pad T to whole chunks have
    g = beta = 0 (they leave the state as it is)."""
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    n = -(-t // chunk)
    pad = n * chunk - t

    def chunks(x):  # [B, T, H, ...] -> [n, B, H, C, ...]
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
        x = x.reshape(b, n, chunk, h, *x.shape[3:])
        return jnp.moveaxis(x, (1, 3), (0, 2))

    q, k, v, g, beta = (chunks(x) for x in (q, k, v, g, beta))
    cum = jnp.cumsum(g, axis=-1)  # [n, B, H, C]
    lower = jnp.tril(jnp.ones((chunk, chunk), bool))
    diff = cum[..., :, None] - cum[..., None, :]
    decay = jnp.where(lower, jnp.exp(jnp.where(lower, diff, 0.0)), 0.0)  # exp(cum_i - cum_j), i >= j
    kb, vb = k * beta[..., None], v * beta[..., None]
    hp = jax.lax.Precision.HIGHEST
    strict = jnp.where(jnp.tril(lower, -1), jnp.einsum("...ik,...jk->...ij", kb, k, precision=hp) * decay, 0.0)
    system = strict + jnp.eye(chunk, dtype=F32)  # I + strictly-lower(beta k k^T decay): the UT transform's inverse
    rhs = jnp.concatenate([vb, kb * jnp.exp(cum)[..., None]], axis=-1)
    solved = jax.lax.linalg.triangular_solve(system, rhs, left_side=True, lower=True, unit_diagonal=True)
    u, w = solved[..., :dv], solved[..., dv:]
    intra = jnp.einsum("...ik,...jk->...ij", q, k, precision=hp) * decay
    qd = q * jnp.exp(cum)[..., None]
    kd = k * jnp.exp(cum[..., -1:] - cum)[..., None]
    cd = jnp.exp(cum[..., -1])[..., None, None]

    def body(s, xs):
        u_c, w_c, qd_c, kd_c, intra_c, cd_c = xs
        v_new = u_c - jnp.einsum("bhck,bhkv->bhcv", w_c, s, precision=hp)
        out = (jnp.einsum("bhck,bhkv->bhcv", qd_c, s, precision=hp)
               + jnp.einsum("bhij,bhjv->bhiv", intra_c, v_new, precision=hp))
        s = s * cd_c + jnp.einsum("bhck,bhcv->bhkv", kd_c, v_new, precision=hp)
        return s, out

    state, out = jax.lax.scan(body, state, (u, w, qd, kd, intra, cd))  # out [n, B, H, C, dv]
    out = jnp.moveaxis(out, (0, 2), (1, 3)).reshape(b, n * chunk, h, dv)[:, :t]
    return out, state


class GatedDeltaNet(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype, grouped: bool):
        d = cfg.hidden_size
        nk, nv, dk, dv, conv_dim = dims(cfg)
        r = nv // nk
        self.grouped = grouped
        if grouped:  # Qwen3-Next: per key head [q, k, v (r heads), z (r heads)] and [b (r), a (r)]
            self.in_qkvz = param((nk, 2 * dk + 2 * r * dv, d), ("linear_heads", "linear_qkvz", "embed"), dtype,
                                  contract=(2,))
            self.in_ba = param((nk, 2 * r, d), ("linear_heads", "linear_ba", "embed"), dtype)
        else:  # Qwen3.5
            self.in_qkv = param((conv_dim, d), ("linear_conv", "embed"), dtype, contract=(1,))
            self.in_z = param((nv * dv, d), ("linear_value", "embed"), dtype, contract=(1,))
            self.in_b = param((nv, d), ("linear_heads", "embed"), dtype)
            self.in_a = param((nv, d), ("linear_heads", "embed"), dtype)
        self.conv = param((conv_dim, cfg.linear_conv_kernel_dim), ("linear_conv", "conv_kernel"), dtype)
        self.dt_bias = param((nv,), ("linear_heads",), dtype, 1.0)
        self.A_log = param((nv,), ("linear_heads",), dtype)
        self.norm = param((dv,), ("norm",), dtype, 1.0)
        self.out = param((d, nv * dv), ("embed", "linear_value"), dtype, contract=(1,))
        self.nk, self.nv, self.dk, self.dv = nk, nv, dk, dv
        self.eps = cfg.rms_norm_eps
        if cfg.hidden_act not in ("silu", "swish"):
            raise ValueError(f"hidden_act {cfg.hidden_act!r} is not supported for Gated DeltaNet")

    def project(self, x):
        """x [B, T, d] -> conv input [B, T, conv_dim] (q, k, v), z [B, T, nv, dv], b, a [B, T, nv]."""
        bsz, t, _ = x.shape
        nk, nv, dk, dv = self.nk, self.nv, self.dk, self.dv
        if self.grouped:
            r = nv // nk
            qkvz = qeinsum("btd,hfd->bthf", x, self.in_qkvz[...])
            q, k = qkvz[..., :dk], qkvz[..., dk:2 * dk]
            v, z = qkvz[..., 2 * dk:2 * dk + r * dv], qkvz[..., 2 * dk + r * dv:]
            ba = jnp.einsum("btd,hfd->bthf", x, self.in_ba[...])
            mixed = jnp.concatenate([q.reshape(bsz, t, -1), k.reshape(bsz, t, -1), v.reshape(bsz, t, -1)], axis=-1)
            return mixed, z.reshape(bsz, t, nv, dv), ba[..., :r].reshape(bsz, t, nv), ba[..., r:].reshape(bsz, t, nv)
        mixed = qeinsum("btd,fd->btf", x, self.in_qkv[...])
        z = qeinsum("btd,fd->btf", x, self.in_z[...]).reshape(bsz, t, nv, dv)
        return mixed, z, jnp.einsum("btd,fd->btf", x, self.in_b[...]), jnp.einsum("btd,fd->btf", x, self.in_a[...])

    def __call__(self, x, cache, kv: LayerKV):
        """x [1, T, d] over a uniform step; cache: every slot's (conv window, matrix state) -> (y, cache)."""
        window_all, state_all = cache
        x, positions = to_rows(x, kv), to_rows(kv.inputs.positions[None], kv)
        bsz, t, _ = x.shape
        nk, nv, dk, dv = self.nk, self.nv, self.dk, self.dv
        valid = positions >= 0
        reset = jnp.any(positions == 0, axis=1)  # a sequence starts here: from a zero state
        window = jnp.where(reset[:, None, None], 0.0, read_slots(window_all, kv).astype(F32))
        state = jnp.where(reset[:, None, None, None], 0.0, read_slots(state_all, kv).astype(F32))

        mixed, z, b, a = self.project(x)
        mixed = jnp.where(valid[..., None], mixed, 0)
        end = jnp.max(jnp.where(valid, jnp.arange(t, dtype=jnp.int32)[None] + 1, 0), axis=1)
        conv, window = causal_conv(mixed.astype(F32), window, self.conv[...].astype(F32), end)
        conv = jax.nn.silu(conv.astype(x.dtype))
        kd = nk * dk
        q = conv[..., :kd].reshape(bsz, t, nk, dk).astype(F32)
        k = conv[..., kd:2 * kd].reshape(bsz, t, nk, dk).astype(F32)
        v = conv[..., 2 * kd:].reshape(bsz, t, nv, dv).astype(F32)
        q = l2norm(q) * dk ** -0.5
        k = l2norm(k)
        if nv != nk:
            q, k = jnp.repeat(q, nv // nk, axis=2), jnp.repeat(k, nv // nk, axis=2)
        beta = jax.nn.sigmoid(b).astype(F32)
        g = -jnp.exp(self.A_log[...].astype(F32)) * jax.nn.softplus(a.astype(F32) + self.dt_bias[...].astype(F32))
        beta, g = jnp.where(valid[..., None], beta, 0.0), jnp.where(valid[..., None], g, 0.0)
        k = jnp.where(valid[..., None, None], k, 0.0)
        if t == 1:
            out, state = recurrent_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], state)
            out = out[:, None]
        else:
            out, state = chunk_delta_rule(q, k, v, g, beta, state, min(CHUNK, t))
        out = out.astype(x.dtype)  # [B, T, nv, dv]

        h = out.astype(F32)  # gated RMSNorm: norm, weight, times silu(z)
        h = h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + self.eps)
        h = (self.norm[...] * h.astype(x.dtype)).astype(F32) * jax.nn.silu(z.astype(F32))
        y = qeinsum("btf,df->btd", h.astype(x.dtype).reshape(bsz, t, nv * dv), self.out[...])

        return from_rows(y), (write_slots(window_all, window, kv), write_slots(state_all, state, kv))
