"""A fast, real serving pipeline for the reliability tests and `bench/soak.py`.

`tiny_checkpoint(dir)` writes a tiny random Qwen2 checkpoint (2 layers, hidden 64, the full Qwen2.5 vocabulary
of 151,936) next to the REAL Qwen2.5 tokenizer and chat template taken from the default model's GGUF, so
`build_chat_service(dir)` runs the whole real pipeline (template, tokenizer, hermes_json format, xgrammar
constraints, jitted engine, parser) with random weights: outputs are gibberish, but constrained requests
still produce valid calls/JSON and greedy outputs are deterministic.
"""

from __future__ import annotations

from pathlib import Path

from tests.tiny_model import tiny_chat_model

CACHE_NAME = "reliability-tiny-qwen2-v1"


def tiny_checkpoint(out_dir: str | Path | None = None) -> Path:
    """Build (or reuse from the jaxchat cache) the tiny checkpoint; returns its directory."""
    from jaxchat.assets import cache_dir

    return tiny_chat_model(out_dir if out_dir is not None else cache_dir() / CACHE_NAME)
