"""Tiny random HF checkpoints (config -> model -> save_pretrained) for the model tests."""

from __future__ import annotations

import pytest

from jaxchat.models import FAMILIES  # every supported family has a tiny checkpoint below

HYBRIDS = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe")  # Gated DeltaNet + gated attention
COMMON = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256}


# Gemma 4: sliding (window 8 < the 32-token test prompts) and full layers of another head_dim and kv-head
# count with partial ("proportional") rope, values = keys on full layers, the last 2 layers KV-shared (layer 4
# reuses sliding layer 3's k/v, layer 5 full layer 2's) with double-wide MLPs, per-layer inputs, 8 experts.
GEMMA4 = {"num_hidden_layers": 6, "sliding_window": 8, "global_head_dim": 32, "num_global_key_value_heads": 1,
          "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                          "sliding_attention", "full_attention"],
          "hidden_size_per_layer_input": 8, "vocab_size_per_layer_input": 256, "attention_k_eq_v": True,
          "num_kv_shared_layers": 2, "use_double_wide_mlp": True, "enable_moe_block": True, "num_experts": 8,
          "top_k_experts": 2, "moe_intermediate_size": 32, "final_logit_softcapping": 30.0}


def tiny_hf_config(family: str, **overrides):
    """The transformers config of the tiny `family` checkpoint and its model class."""
    import transformers as tf

    kw = {**COMMON, **overrides}
    if family == "llama":
        return tf.LlamaConfig(**kw, rope_theta=500000.0, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16}), tf.LlamaForCausalLM
    if family == "qwen2":
        return tf.Qwen2Config(**kw, tie_word_embeddings=True), tf.Qwen2ForCausalLM
    if family == "qwen3":
        return tf.Qwen3Config(**kw), tf.Qwen3ForCausalLM
    if family == "qwen3_moe":
        moe = {"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True}
        return tf.Qwen3MoeConfig(**{**moe, **kw}), tf.Qwen3MoeForCausalLM
    if family == "gemma3_text":
        kw["num_hidden_layers"] = overrides.get("num_hidden_layers", 4)
        cfg = tf.Gemma3TextConfig(**kw, sliding_window=8, query_pre_attn_scalar=24, final_logit_softcapping=30.0)
        cfg.layer_types = ["sliding_attention", "full_attention"] * (kw["num_hidden_layers"] // 2)
        return cfg, tf.Gemma3ForCausalLM
    if family == "gpt_oss":
        # 4 layers alternating sliding (window 8 < the 32-token prompts) / full; 8 experts, top 4; the
        # default YaRN rope (factor 32 over 4096 original positions: its ramp falls inside head_dim 16, and
        # its attention factor scales cos/sin; max_position_embeddings = factor x original, as transformers
        # expects); a low swiglu_limit so that the clamps bite
        kw["num_hidden_layers"] = overrides.get("num_hidden_layers", 4)
        kw["intermediate_size"] = overrides.get("intermediate_size", 32)
        kw.setdefault("num_local_experts", 8)
        kw.setdefault("num_experts_per_tok", 4)
        kw.setdefault("sliding_window", 8)
        kw.setdefault("swiglu_limit", 1.0)
        kw["max_position_embeddings"] = overrides.get("max_position_embeddings", 32 * 4096)  # YaRN's 32 x 4096
        return tf.GptOssConfig(**kw), tf.GptOssForCausalLM
    if family == "gemma4_text":
        return tf.Gemma4TextConfig(**{**COMMON, **GEMMA4, **overrides}), tf.Gemma4ForCausalLM
    if family in ("lfm2", "lfm2_moe"):  # conv first, attention between, 4 layers
        kw["num_hidden_layers"] = overrides.get("num_hidden_layers", 4)
        kw.setdefault("layer_types", (["conv", "full_attention"] * 4)[:kw["num_hidden_layers"]])
        kw.pop("head_dim")
        kw["initializer_range"] = 0.15  # the default 0.02 leaves the conv branch too small to test
        if family == "lfm2":  # MLP size 2/3 * 128 rounded up to 32 (96), as LFM2 adjusts it
            return tf.Lfm2Config(**kw, block_multiple_of=32, tie_word_embeddings=False), tf.Lfm2ForCausalLM
        return tf.Lfm2MoeConfig(**kw, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                                num_dense_layers=1), tf.Lfm2MoeForCausalLM
    if family in HYBRIDS:
        kw["num_hidden_layers"] = overrides.get("num_hidden_layers", 4)
        kw.update(layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=8,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
        kw["layer_types"] = kw["layer_types"][:kw["num_hidden_layers"]]
        moe = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
               "shared_expert_intermediate_size": 48}
        if family == "qwen3_next":
            return tf.Qwen3NextConfig(**kw, **moe, mlp_only_layers=[2]), tf.Qwen3NextForCausalLM
        if family == "qwen3_5_text":
            return tf.Qwen3_5TextConfig(**kw), tf.Qwen3_5ForCausalLM
        kw.pop("intermediate_size")
        return tf.Qwen3_5MoeTextConfig(**kw, **moe), tf.Qwen3_5MoeForCausalLM
    raise ValueError(family)


def build_tiny(family: str, out_dir, *, dtype="float32", seed: int = 0, max_shard_size=None, **overrides):
    """Save a random tiny `family` checkpoint (norms and biases randomised too) and return the torch model."""
    import torch

    torch.manual_seed(seed)
    cfg, model_cls = tiny_hf_config(family, **overrides)
    model = model_cls(cfg)
    model.eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if family == "gemma4_text" and ("norm" in name or "scale" in name):  # multiplies by w, not 1 + w
                p.uniform_(0.5, 1.5)
            elif "norm" in name or "bias" in name:
                p.normal_(0.0, 0.3)
            elif name.endswith(("sinks", "router.weight", "experts.gate_up_proj", "experts.down_proj")):
                p.normal_(0.0, 0.5 if name.endswith("sinks") else 0.2)
            elif name.endswith("A_log"):  # decays from mild to strong (exp(A) in 0.05 .. 2)
                p.uniform_(-3.0, 0.7)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.uniform_(0.5, 1.5)
            elif name.endswith("expert_bias"):  # lfm2_moe's routing bias changes which experts are chosen
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
