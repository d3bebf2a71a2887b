"""Orbax round trip: convert (save) then load gives identical logits, config and tokenizer-less metadata."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxchat.models import ModelLoadError, empty_cache, load_model, save_orbax


@pytest.mark.parametrize("family", ["qwen2", "gemma3_text", "qwen3_moe", "lfm2_moe"])  # listed layers: also test_listed_layers
def test_orbax_round_trip_identical_logits(family, tiny_dirs, tmp_path):
    src = load_model(tiny_dirs[family][0])
    dst = save_orbax(src, tmp_path / "ckpt")
    back = load_model(dst)
    assert back.config == src.config
    assert back.eos_token_ids == src.eos_token_ids
    toks = jnp.asarray(np.arange(24).reshape(2, 12) * 11 % 256, jnp.int32)
    pos = jnp.tile(jnp.arange(12, dtype=jnp.int32), (2, 1))
    ck, cv = empty_cache(src.config, 2, 16, jnp.float32)
    a = src.forward(src.params, toks, pos, ck, cv)[0]
    b = back.forward(back.params, toks, pos, ck, cv)[0]
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    half = load_model(dst, dtype="bfloat16")
    assert {x.dtype for x in jax.tree.leaves(half.params)} == {jnp.dtype(jnp.bfloat16)}
    with pytest.raises(ModelLoadError, match="not empty"):
        save_orbax(src, dst)
