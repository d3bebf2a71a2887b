"""Tiny random HF checkpoints (config -> model -> save_pretrained) for the model tests."""

from __future__ import annotations

import pytest

from jaxchat.models import FAMILIES  # every supported family has a tiny checkpoint below

HYBRIDS = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe")  # Gated DeltaNet + gated attention
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
    elif family in HYBRIDS:
        kw["num_hidden_layers"] = overrides.get("num_hidden_layers", 4)
        kw.update(layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
        kw["layer_types"] = kw["layer_types"][:kw["num_hidden_layers"]]
        moe = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "shared_expert_intermediate_size": 48}
        if family == "qwen3_next":
            model = tf.Qwen3NextForCausalLM(tf.Qwen3NextConfig(**kw, **moe, mlp_only_layers=[2]))
        elif family == "qwen3_5_text":
            model = tf.Qwen3_5ForCausalLM(tf.Qwen3_5TextConfig(**kw))
        else:
            kw.pop("intermediate_size")
            model = tf.Qwen3_5MoeForCausalLM(tf.Qwen3_5MoeTextConfig(**kw, **moe))
    else:
        raise ValueError(family)
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or "bias" in name:
                p.normal_(0.0, 0.3)
            elif name.endswith("A_log"):  # decays from mild to strong (exp(A) in 0.05 .. 2)
                p.uniform_(-3.0, 0.7)
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
