"""A fast, real serving pipeline for the reliability tests and `bench/soak.py`.

`tiny_checkpoint(dir)` writes a tiny random Qwen2 checkpoint (2 layers, hidden 64, the full Qwen2.5 vocabulary
of 151,936) next to the REAL Qwen2.5 tokenizer and chat template taken from the default model's GGUF, so
`build_chat_service(dir)` runs the whole real pipeline (template, tokenizer, hermes_json format, xgrammar
constraints, jitted engine, parser) with random weights: outputs are gibberish, but constrained requests
still produce valid calls/JSON and greedy outputs are deterministic.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CACHE_NAME = "reliability-tiny-qwen2-v1"


def tiny_checkpoint(out_dir: str | Path | None = None) -> Path:
    """Build (or reuse from the jaxchat cache) the tiny checkpoint; returns its directory."""
    from jaxchat.assets import DEFAULT_MODEL, asset_path, cache_dir

    out = Path(out_dir) if out_dir is not None else cache_dir() / CACHE_NAME
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    import torch
    import transformers as tf

    from jaxchat.models.gguf_loader import gguf_tokenizer

    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.manual_seed(0)
    cfg = tf.Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=151936, max_position_embeddings=4096,
                         tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645)
    model = tf.Qwen2ForCausalLM(cfg).eval()
    model.save_pretrained(str(tmp), safe_serialization=True)
    p = asset_path(DEFAULT_MODEL)
    tok = gguf_tokenizer(p, None)  # the real Qwen2.5 tokenizer + chat template (cached conversion)
    assert tok.chat_template and "<tool_call>" in tok.chat_template, "the default model's template lost its tools"
    tok.save_pretrained(str(tmp))
    try:
        tmp.rename(out)
    except OSError:  # another process built it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out
