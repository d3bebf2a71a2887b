"""YaRN rope: jaxchat's frequencies and attention factor equal transformers' for gpt-oss's and other settings."""

from __future__ import annotations

import numpy as np
import pytest

from jaxchat.models import from_hf_config
from jaxchat.models.layers import rope_attention_factor, rope_inv_freq

YARNS = [
    {"factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
    {"factor": 4.0, "original_max_position_embeddings": 2048},  # truncate defaults to True
    {"factor": 8.0, "beta_fast": 16.0, "beta_slow": 2.0, "mscale": 1.0, "mscale_all_dim": 0.5,
     "original_max_position_embeddings": 1024},
    {"factor": 16.0, "attention_factor": 1.25, "original_max_position_embeddings": 512},
]


@pytest.mark.parametrize("head_dim", [16, 64])
@pytest.mark.parametrize("yarn", YARNS)
def test_yarn_matches_transformers(yarn, head_dim):
    import transformers as tf
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf = tf.GptOssConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim, num_hidden_layers=2,
                         max_position_embeddings=131072,
                         rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, **yarn})
    want_inv, want_factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    cfg = from_hf_config(hf.to_dict())
    assert cfg.rope_scaling["rope_type"] == "yarn"
    inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    np.testing.assert_allclose(inv, want_inv.numpy(), rtol=1e-6)
    assert rope_attention_factor(cfg.rope_scaling) == pytest.approx(want_factor, rel=1e-9)
    assert rope_attention_factor(None) == 1.0
