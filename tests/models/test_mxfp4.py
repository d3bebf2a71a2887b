"""MXFP4 expert weights (gpt-oss): the numpy dequantisation equals transformers' own conversion, and a
checkpoint storing its experts as `_blocks` / `_scales` loads to transformers' logits."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxchat.models import ModelLoadError, load_model
from jaxchat.models.mxfp4 import dequantize, fold_mxfp4
from jaxchat.models.weights import Tensor

from .conftest import build_tiny
from .paged import PagedRows


def random_mxfp4(rng, shape, lo=118, hi=130):
    """Random blocks [*shape, 16] and e8m0 scales [*shape] (exponents lo - 127 .. hi - 127)."""
    return rng.integers(0, 256, (*shape, 16), dtype=np.uint8), rng.integers(lo, hi, shape, dtype=np.uint8)


def hf_dequantize(blocks, scales):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    return convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32)


def test_dequantize_matches_transformers():
    rng = np.random.default_rng(0)
    blocks, scales = random_mxfp4(rng, (3, 10, 4), lo=100, hi=150)
    ours = dequantize(blocks, scales)
    assert ours.shape == (3, 4 * 32, 10) and ours.dtype == np.float32
    np.testing.assert_array_equal(ours, hf_dequantize(blocks, scales).numpy())
    assert dequantize(blocks, scales, jnp.bfloat16).dtype == jnp.bfloat16


def test_fold_pairs_blocks_with_scales_and_names_strays():
    rng = np.random.default_rng(1)
    b, s = random_mxfp4(rng, (2, 6, 2))
    t = {"x.w_blocks": Tensor(b.shape, lambda: b), "x.w_scales": Tensor(s.shape, lambda: s),
         "x.bias": Tensor((2,), lambda: np.zeros(2))}
    out = fold_mxfp4(t)
    assert sorted(out) == ["x.bias", "x.w"] and out["x.w"].shape == (2, 64, 6)
    np.testing.assert_array_equal(out["x.w"].load(), dequantize(b, s))
    with pytest.raises(ModelLoadError, match="x.w_blocks"):
        fold_mxfp4({"x.w_blocks": t["x.w_blocks"]})
    with pytest.raises(ModelLoadError, match="x.w_scales"):
        fold_mxfp4({"x.w_scales": t["x.w_scales"]})


def test_mxfp4_checkpoint_loads_to_transformers_logits(tmp_path):
    """The tiny gpt_oss checkpoint with every expert matrix replaced by random MXFP4 blocks/scales (the
    torch model given transformers' dequantisation of them) gives transformers' logits."""
    from safetensors.numpy import load_file, save_file

    model = build_tiny("gpt_oss", tmp_path)
    cfg = model.config
    e, d, f = cfg.num_local_experts, cfg.hidden_size, cfg.intermediate_size
    rng = np.random.default_rng(2)
    tensors = load_file(str(tmp_path / "model.safetensors"))
    for i, layer in enumerate(model.model.layers):
        for name, rows, cols in (("gate_up_proj", 2 * f, d), ("down_proj", d, f)):
            blocks, scales = random_mxfp4(rng, (e, rows, cols // 32))
            key = f"model.layers.{i}.mlp.experts.{name}"
            del tensors[key]
            tensors[key + "_blocks"], tensors[key + "_scales"] = blocks, scales
            getattr(layer.mlp.experts, name).data = hf_dequantize(blocks, scales)
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    lm = load_model(tmp_path)
    ids = np.random.default_rng(3).integers(0, 256, (1, 16))
    with torch.no_grad():
        ref = model(torch.tensor(ids)).logits.numpy()
    logits = PagedRows(lm, 1, 16)(ids, np.arange(16)[None])
    assert np.abs(logits - ref).max() <= 1e-4
