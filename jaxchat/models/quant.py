"""Int8 weights and the W8A8 matmul.

Contract:
- `Int8Weight(values, scale, dtype)` is a pytree node standing in for a float weight: `values` int8 of the
  weight's shape, `scale` float32 of the same rank with the contracted (input) axes reduced to 1 (one scale
  per output channel), and `dtype` (static) the float dtype the weight replaces. weight ~= values * scale.
  `w[...]` is `w` itself, so an `nnx.Param` holding one reads like one holding an array; `.shape` is the
  values' shape and `.dtype` the float dtype.
- `quantize_weight(w, contract_axes)`: symmetric per-output-channel quantisation, scale = absmax / 127 over
  `contract_axes` (an all-zero channel gets scale 1), values = round(w / scale).
- `qeinsum(spec, a, b, preferred_element_type=None)`: exactly `jnp.einsum` when neither operand is an
  `Int8Weight`. When one is, the other (the activations) is quantised on the fly the same way, per row (absmax
  over its contracted axes), the einsum runs int8 x int8 -> int32 and the result is rescaled by both scales,
  returned in `preferred_element_type` or else the activations' dtype. Specs are explicit (no "...") and every
  label of the output appears in one operand only or in both uncontracted (no summed batch labels). When the
  activations have exactly one row they are padded to two with a zero row (`PAD_SINGLE_ROW`): XLA:CPU's int8
  GEMM has no fast path for a single row.
- `take(w, indices, axis)`: `jnp.take` that, for an `Int8Weight` (scale per entry of `axis`), dequantises only
  the entries it reads, in the weight's float dtype.
- `expert_rows(w, e)` / `dequantize(w)`: expert e's matrix ([E, in, out] -> [in, out]) and a whole weight, as
  floats in the weight's dtype; a float weight passes through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import jax
import jax.numpy as jnp

PAD_SINGLE_ROW = True


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class Int8Weight:
    values: jax.Array
    scale: jax.Array
    dtype: str = field(default="float32", metadata={"static": True})

    def __getitem__(self, key):
        if key is Ellipsis:
            return self
        raise TypeError("index an Int8Weight's values or scale, not the weight")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.values.shape)

    @property
    def ndim(self) -> int:
        return len(self.values.shape)

    def reshape(self, values_shape, scale_shape) -> Int8Weight:
        return Int8Weight(self.values.reshape(values_shape), self.scale.reshape(scale_shape), self.dtype)


def is_quantized(w) -> bool:
    return isinstance(w, Int8Weight)


def _absmax_scale(x, axes):
    amax = jnp.max(jnp.abs(x), axis=axes, keepdims=True)
    return jnp.where(amax > 0, amax / 127.0, 1.0).astype(jnp.float32)


def _to_int8(x, scale):
    return jnp.clip(jnp.round(x / scale), -127, 127).astype(jnp.int8)


def quantize_weight(w, contract_axes: tuple[int, ...]) -> Int8Weight:
    """Per-output-channel symmetric int8 (see the module docstring)."""
    axes = tuple(a % w.ndim for a in contract_axes)
    wf = jnp.asarray(w).astype(jnp.float32)
    scale = _absmax_scale(wf, axes)
    return Int8Weight(_to_int8(wf, scale), scale, jnp.dtype(w.dtype).name)


def dequantize(w):
    if not is_quantized(w):
        return w
    return (w.values.astype(jnp.float32) * w.scale).astype(w.dtype)


def take(w, indices, axis: int):
    if not is_quantized(w):
        return jnp.take(w, indices, axis=axis)
    vals = jnp.take(w.values, indices, axis=axis).astype(jnp.float32)
    return (vals * jnp.take(w.scale, indices, axis=axis)).astype(w.dtype)


def expert_rows(w, e):
    if not is_quantized(w):
        return w[e]
    return (w.values[e].astype(jnp.float32) * w.scale[e]).astype(w.dtype)


def _in_out_layout(s, labels: str, contracted: set[str], out: str):
    """A scale over `labels` (size 1 on the contracted ones) laid out for broadcasting against `out`."""
    kept = [c for c in labels if c not in contracted]
    s = s.reshape([n for n, c in zip(s.shape, labels, strict=True) if c not in contracted])
    s = jnp.transpose(s, [kept.index(c) for c in out if c in kept])
    sizes = dict(zip([c for c in out if c in kept], s.shape, strict=True))
    return s.reshape([sizes.get(c, 1) for c in out])


def qeinsum(spec: str, a, b, *, preferred_element_type=None):
    """`jnp.einsum(spec, a, b)`, in int8 when one operand is an `Int8Weight` (module docstring)."""
    if not is_quantized(a) and not is_quantized(b):
        return jnp.einsum(spec, a, b, preferred_element_type=preferred_element_type)
    if "..." in spec or (is_quantized(a) and is_quantized(b)):
        raise ValueError(f"qeinsum {spec!r}: explicit labels and one quantised operand only")
    ins, out = spec.replace(" ", "").split("->")
    la, lb = ins.split(",")
    w_first = is_quantized(a)
    w, x, lw, lx = (a, b, la, lb) if w_first else (b, a, lb, la)
    contracted = (set(lw) & set(lx)) - set(out)
    x_axes = tuple(i for i, c in enumerate(lx) if c in contracted)
    sx = _absmax_scale(x.astype(jnp.float32), x_axes)
    xq = _to_int8(x.astype(jnp.float32), sx)
    rows = [i for i, c in enumerate(lx) if c not in contracted]
    pad = PAD_SINGLE_ROW and rows and all(x.shape[i] == 1 for i in rows)
    if pad:  # one row: add a zero row on the first row axis, drop it from the result
        xq = jnp.concatenate([xq, jnp.zeros_like(xq)], axis=rows[0])
    acc = jnp.einsum(spec, w.values if w_first else xq, xq if w_first else w.values,
                     preferred_element_type=jnp.int32)
    if pad:
        acc = jax.lax.slice_in_dim(acc, 0, 1, axis=out.index(lx[rows[0]]))
    y = (acc.astype(jnp.float32) * _in_out_layout(sx, lx, contracted, out)
         * _in_out_layout(w.scale, lw, contracted, out))
    return y.astype(preferred_element_type or x.dtype)
