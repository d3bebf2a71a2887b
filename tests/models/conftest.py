"""Tiny random HF checkpoints (config -> model -> save_pretrained) for the model tests."""

from __future__ import annotations

import pytest

from jaxchat.models import FAMILIES  # every supported family has a tiny checkpoint below

COMMON = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256}


def build_tiny(family: str, out_dir, *, dtype="float32", seed: int = 0, max_shard_size=None, **overrides):
    """Save a random tiny `family` checkpoint (norms and biases randomised too) and return the torch model."""
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    kw = {**COMMON, **overrides}
    if family == "llama":
        cfg = tf.LlamaConfig(**kw, rope_theta=500000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16})
        model = tf.LlamaForCausalLM(cfg)
    elif family == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**kw, tie_word_embeddings=True))
    elif family == "qwen3":
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**kw))
    elif family == "gemma3_text":
        kw["num_hidden_layers"] = overrides.get("num_hidden_layers", 4)
        cfg = tf.Gemma3TextConfig(**kw, sliding_window=8, query_pre_attn_scalar=24, final_logit_softcapping=30.0)
        cfg.layer_types = ["sliding_attention", "full_attention"] * (kw["num_hidden_layers"] // 2)
        model = tf.Gemma3ForCausalLM(cfg)
    elif family in ("lfm2", "lfm2_moe"):  # conv first, attention between, 4 layers
        kw["num_hidden_layers"] = overrides.get("num_hidden_layers", 4)
        kw.setdefault("layer_types", (["conv", "full_attention"] * 4)[:kw["num_hidden_layers"]])
        kw.pop("head_dim")
        kw["initializer_range"] = 0.15  # the default 0.02 leaves the conv branch too small to test
        if family == "lfm2":  # MLP size 2/3 * 128 rounded up to 32 (96), as LFM2 adjusts it
            model = tf.Lfm2ForCausalLM(tf.Lfm2Config(**kw, block_multiple_of=32, tie_word_embeddings=False))
        else:
            model = tf.Lfm2MoeForCausalLM(tf.Lfm2MoeConfig(**kw, moe_intermediate_size=32, num_experts=8,
                                                          num_experts_per_tok=2, num_dense_layers=1))
    else:
        raise ValueError(family)
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.normal_(0.0, 0.3)
        for name, b in model.named_buffers():
            if name.endswith("expert_bias"):  # lfm2_moe's routing bias changes which experts are chosen
                b.normal_(0.0, 0.3)
    if dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(out_dir), **kwargs)
    return model


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """family -> (checkpoint dir, torch model), built once per session."""
    out = {}
    for fam in FAMILIES:
        d = tmp_path_factory.mktemp(fam)
        out[fam] = (d, build_tiny(fam, d))
    return out
