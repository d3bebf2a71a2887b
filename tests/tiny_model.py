"""A tiny random Qwen2 checkpoint with the real Qwen2.5 tokenizer: a fast, real pipeline for serving tests.

`tiny_chat_model(dir, template=None)` writes (once; reused when present) an HF directory with a 2-layer,
hidden-64 random Qwen2 over the full Qwen2.5 vocabulary, next to the REAL Qwen2.5 tokenizer and chat
template taken from the default model's GGUF; `template` replaces the chat template by the named real
template (e.g. "Qwen-QwQ-32B.jinja" for a reasoning format) and `special_tokens` are added to the
vocabulary (another format's markers, as single tokens; the model's logits grow to cover them); `model`
(vocab size -> a random transformers model) replaces the tiny Qwen2 by another family's tiny model.
`build_chat_service(dir)` then runs the
whole real pipeline with random weights: outputs are gibberish, but constrained requests still produce
valid calls/JSON and greedy outputs are deterministic.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

# The two shape sets the tiny Qwen2 is served in, so that each program compiles once per test run and the other
# files that serve it load it from the run's cache: in process (`build_chat_service`: one decode program, one
# ragged one, their sampler) and through `jaxchat serve` (flags `SERVE_ARGS`; the jump-forward and prefix-cache
# services use the same shapes in process).
IN_PROCESS_SHAPES = {"max_batch": 8, "max_context": 512, "decode_rows": (8,), "step_token_buckets": (256,)}
SERVE_SHAPES = {"max_batch": 2, "max_context": 512, "max_step_tokens": 64}
SERVE_ARGS = tuple(arg for name, value in SERVE_SHAPES.items() for arg in (f"--{name.replace('_', '-')}", str(value)))


def tiny_chat_model(directory: str | Path, template: str | None = None, seed: int = 0,
                    special_tokens: tuple[str, ...] = (), model=None) -> Path:
    out = Path(directory)
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from jaxchat.assets import DEFAULT_MODEL, asset_path, template_path
    from jaxchat.models.gguf_loader import gguf_tokenizer

    tokenizer = gguf_tokenizer(asset_path(DEFAULT_MODEL), None)
    assert tokenizer.chat_template and "<tool_call>" in tokenizer.chat_template, "the default model's template lost its tools"
    if template:
        tokenizer.chat_template = template_path(template).read_text()
    if special_tokens:  # new ids above the vocabulary's 151,936 (its spare ids are [PAD...] tokens)
        tokenizer.add_tokens(list(special_tokens), special_tokens=True)
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.manual_seed(seed)
    vocab_size = -(-len(tokenizer) // 64) * 64
    if model is None:
        config = Qwen2Config(
            vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
            bos_token_id=151643, eos_token_id=151645,
        )
        net = Qwen2ForCausalLM(config)
    else:
        net = model(vocab_size)
    net.eval().save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    try:
        tmp.rename(out)
    except OSError:  # another process built it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out
