"""A tiny random Qwen2 checkpoint with the real Qwen2.5 tokenizer: a fast, real pipeline for serving tests.

`tiny_chat_model(dir, template=None)` writes an HF directory (config, safetensors weights, tokenizer) whose
outputs are random but deterministic at temperature 0; `template` replaces the chat template by the
named real template (e.g. "Qwen-QwQ-32B.jinja" for a reasoning format).
"""

from __future__ import annotations

from pathlib import Path


def tiny_chat_model(directory: Path, template: str | None = None, seed: int = 0) -> Path:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from jaxchat.assets import DEFAULT_MODEL, asset_path, template_path
    from jaxchat.models.gguf_loader import gguf_tokenizer

    directory = Path(directory)
    if (directory / "config.json").exists():
        return directory
    tokenizer = gguf_tokenizer(asset_path(DEFAULT_MODEL), None)
    if template:
        tokenizer.chat_template = template_path(template).read_text()
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )
    Qwen2ForCausalLM(config).save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))
    return directory
