"""Every registered family's config.json table (`HF_CONFIG` beside `config.SHARED`) against transformers.

For each family, two reference dicts written by transformers itself: the tiny config the parity tests build
(`conftest.tiny_hf_config`) and the config class's defaults (`transformers.Qwen2Config().to_dict()`, ...).
Each is read, written and read again to the same `ModelConfig`; what `to_hf_config` writes is given to
the transformers config class of its `model_type`, whose own dict reads back to the same config again.
The GGUF reader takes the family flags from the same tables.
"""

from __future__ import annotations

import dataclasses

import pytest
from transformers import CONFIG_MAPPING

from jaxchat.models import FAMILIES, ModelConfig, ModelLoadError, from_hf_config, to_hf_config
from jaxchat.models.config import table
from jaxchat.models.families import family_module, gguf_families
from jaxchat.models.gguf_loader import config_from_gguf

from .conftest import tiny_hf_config

# transformers' default Lfm2MoeConfig has no layer_types (its model cannot be built from it): see below
CASES = [(f, kind) for f in FAMILIES for kind in ("tiny", "default") if (f, kind) != ("lfm2_moe", "default")]


def reference(family: str, kind: str) -> dict:
    tiny = tiny_hf_config(family)[0]
    return (tiny if kind == "tiny" else type(tiny)()).to_dict()


@pytest.mark.parametrize(("family", "kind"), CASES)
def test_read_write_read_against_transformers(family, kind):
    ref = reference(family, kind)
    cfg = from_hf_config(ref)
    assert cfg.family == family
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_layers, cfg.num_heads) == (
        ref["vocab_size"], ref["hidden_size"], ref["num_hidden_layers"], ref["num_attention_heads"])
    assert cfg.num_kv_heads == (ref.get("num_key_value_heads") or ref["num_attention_heads"])
    if ref.get("layer_types"):  # families that only have full attention layers need not keep them
        assert cfg.layer_types in (tuple(ref["layer_types"]), None)
        assert cfg.is_sliding == tuple(t == "sliding_attention" for t in ref["layer_types"])
    written = to_hf_config(cfg)
    back = from_hf_config(written)
    assert back == cfg and hash(back) == hash(cfg)
    # transformers accepts what we write, and means the same model by it
    config_cls = CONFIG_MAPPING[written["model_type"]]
    theirs = config_cls(**{k: v for k, v in written.items() if k != "model_type"}).to_dict()
    assert from_hf_config(theirs) == cfg


def test_lfm2_moe_needs_layer_types():
    with pytest.raises(ModelLoadError, match="'layer_types'"):
        from_hf_config(reference("lfm2_moe", "default"))


@pytest.mark.parametrize("family", FAMILIES)
def test_table_rows_name_config_fields(family):
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    rows = table(family_module(family).HF_CONFIG)
    assert {r.field for r in rows if r.field is not None} <= fields
    written = [r.key for r in rows if r.field is not None and r.keys]
    assert len(written) == len(set(written)), "two fields write one key"


class _Field:
    def __init__(self, value):
        self.value = value

    def contents(self):
        return self.value


class _Reader:  # the part of gguf.GGUFReader that config_from_gguf reads
    def __init__(self, arch: str, **meta):
        base = {"embedding_length": 64, "attention.head_count": 4, "attention.head_count_kv": 2,
                "feed_forward_length": 128, "block_count": 12, "attention.layer_norm_rms_epsilon": 1e-6,
                "context_length": 512, "attention.key_length": 32}
        self.fields = {"general.architecture": _Field(arch), "tokenizer.ggml.eos_token_id": _Field(2),
                       **{f"{arch}.{k}": _Field(v) for k, v in {**base, **meta}.items()}}


def test_gguf_reads_family_flags_from_the_tables():
    assert gguf_families() == {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
    names = {"output.weight"}
    llama = config_from_gguf(_Reader("llama"), names, 100)
    assert (llama.family, llama.vocab_size, llama.head_dim, llama.eos_token_ids) == ("llama", 100, 32, (2,))
    assert not (llama.attention_bias or llama.qk_norm or llama.tie_word_embeddings)
    assert config_from_gguf(_Reader("llama"), names | {"blk.0.attn_q.bias"}, 100).attention_bias
    assert config_from_gguf(_Reader("qwen2"), names, 100).attention_bias  # Qwen2's q/k/v biases
    assert config_from_gguf(_Reader("qwen3"), names, 100).qk_norm
    gemma = config_from_gguf(_Reader("gemma3", **{"attention.sliding_window": 16}), set(), 100)
    assert gemma.tie_word_embeddings and gemma.qk_norm and gemma.hidden_act == "gelu_pytorch_tanh"
    assert gemma.is_sliding == (True,) * 5 + (False,) + (True,) * 5 + (False,)  # every sixth layer global
    assert (gemma.sliding_window, gemma.query_pre_attn_scalar, gemma.rope_local_base_freq) == (16, 32.0, 10000.0)
    with pytest.raises(ModelLoadError, match="gemma3.attention.sliding_window"):
        config_from_gguf(_Reader("gemma3"), set(), 100)
    with pytest.raises(ModelLoadError, match="'mamba'"):
        config_from_gguf(_Reader("mamba"), set(), 100)
