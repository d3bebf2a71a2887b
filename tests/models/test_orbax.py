"""Orbax round trip: convert (save) then load gives identical logits, config and tokenizer-less metadata."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxchat.models import ModelLoadError, load_model, save_orbax

from .paged import PagedRows


@pytest.mark.parametrize("family", ["qwen2", "gemma3_text", "qwen3_moe", "lfm2_moe"])  # listed layers: also test_listed_layers
def test_orbax_round_trip_identical_logits(family, tiny_dirs, tmp_path):
    src = load_model(tiny_dirs[family][0])
    dst = save_orbax(src, tmp_path / "ckpt")
    back = load_model(dst)
    assert back.config == src.config
    assert back.eos_token_ids == src.eos_token_ids
    toks = np.arange(24).reshape(2, 12) * 11 % 256
    pos = np.tile(np.arange(12), (2, 1))
    a = PagedRows(src, 2, 16)(toks, pos)
    b = PagedRows(back, 2, 16)(toks, pos)
    np.testing.assert_array_equal(a, b)
    half = load_model(dst, dtype="bfloat16")
    assert {x.dtype for x in jax.tree.leaves(half.params)} == {jnp.dtype(jnp.bfloat16)}
    with pytest.raises(ModelLoadError, match="not empty"):
        save_orbax(src, dst)
