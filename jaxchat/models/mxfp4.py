"""MXFP4 expert weights (gpt-oss checkpoints), dequantised at load; numpy only.

Contract:
- An MXFP4 tensor is a pair `<name>_blocks` (uint8 [*lead, rows, G, 16]: per byte two FP4 (e2m1) codes,
  the low nibble first) and `<name>_scales` (uint8 [*lead, rows, G]: one e8m0 exponent per block of 32
  values, biased by 127). `dequantize(blocks, scales, dtype)` gives [*lead, G * 32, rows]: the values
  code * 2 ** (scale - 127), the last two axes swapped, which turns gpt-oss's stored [E, out, in] into
  the [E, in, out] layout of its unquantised `gate_up_proj` / `down_proj`.
- `fold_mxfp4(tensors, dtype)` replaces each `_blocks` / `_scales` pair of a checkpoint mapping
  (name -> `weights.Tensor`) by one tensor named `<name>` whose shape is the dequantised one and whose
  load dequantises (to `dtype`), so the family's strict table sees the unquantised names. A `_blocks`
  without its `_scales` (or the reverse), or shapes that do not pair, raise `ModelLoadError` naming it.
"""

from __future__ import annotations

import numpy as np

from jaxchat.models.config import ModelLoadError
from jaxchat.models.weights import Tensor

FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                       -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def dequantize(blocks: np.ndarray, scales: np.ndarray, dtype=np.float32) -> np.ndarray:
    """uint8 blocks [*lead, rows, G, B] and e8m0 scales [*lead, rows, G] -> [*lead, G * 2B, rows] in dtype.

    Converted one leading index (one expert) at a time into the output, so the float32 temporaries stay the
    size of one expert's matrix."""
    blocks = np.asarray(blocks, np.uint8)
    scales = np.asarray(scales, np.uint8)
    if blocks.shape[:-1] != scales.shape:
        raise ValueError(f"blocks {blocks.shape} and scales {scales.shape} do not pair")
    *lead, rows, g, b = blocks.shape
    out = np.empty((*lead, g * 2 * b, rows), dtype)
    flat_out = out.reshape(-1, g * 2 * b, rows)
    for i, (blk, sc) in enumerate(zip(blocks.reshape(-1, rows, g, b), scales.reshape(-1, rows, g), strict=True)):
        flat_out[i] = _dequantize_matrix(blk, sc).T
    return out


def _dequantize_matrix(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """blocks [rows, G, B], scales [rows, G] -> float32 [rows, G * 2B]."""
    rows, g, b = blocks.shape
    out = np.empty((rows, g, 2 * b), np.float32)
    out[..., 0::2] = FP4_VALUES[blocks & 0x0F]
    out[..., 1::2] = FP4_VALUES[blocks >> 4]
    # 2 ** (scale - 127) as a float32 power of two (e8m0 0 is 2 ** -127, a subnormal)
    out *= np.ldexp(np.float32(1.0), scales.astype(np.int32) - 127).astype(np.float32)[..., None]
    return out.reshape(rows, g * 2 * b)


def fold_mxfp4(tensors: dict[str, Tensor], dtype=np.float32) -> dict[str, Tensor]:
    """The mapping with every `_blocks` / `_scales` pair replaced by its dequantised tensor."""
    out = {n: t for n, t in tensors.items() if not n.endswith(("_blocks", "_scales"))}
    for name, t in tensors.items():
        if name.endswith("_scales"):
            if name.removesuffix("_scales") + "_blocks" not in tensors:
                raise ModelLoadError(f"tensor {name!r}: MXFP4 scales without {name.removesuffix('_scales')}_blocks")
            continue
        if not name.endswith("_blocks"):
            continue
        base = name.removesuffix("_blocks")
        s = tensors.get(base + "_scales")
        if s is None:
            raise ModelLoadError(f"tensor {name!r}: MXFP4 blocks without {base}_scales")
        if len(t.shape) < 3 or tuple(t.shape[:-1]) != tuple(s.shape):
            raise ModelLoadError(f"tensor {name!r}: shape {tuple(t.shape)} does not pair with {base}_scales "
                                 f"{tuple(s.shape)}")
        if base in out:
            raise ModelLoadError(f"tensor {base!r} is stored both unquantised and as MXFP4")
        *lead, rows, g, b = t.shape
        out[base] = Tensor((*lead, g * 2 * b, rows), _loader(t, s, base, dtype))
    return out


def _loader(blocks: Tensor, scales: Tensor, name: str, dtype):
    def load():
        try:
            return dequantize(blocks.load(), scales.load(), dtype)
        except ValueError as e:
            raise ModelLoadError(f"tensor {name!r}: {e}") from e

    return load
