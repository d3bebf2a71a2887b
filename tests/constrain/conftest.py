"""Session fixtures: real vocabularies and one GrammarEngine per vocabulary (built once, they are slow).

- `qwen25`: the default model's tokenizer (Qwen2.5 GGUF; its HF form is cached under pytest's cache
  dir, so only the first session pays the ~12 s GGUF read); markers like `<think>` are spelled out.
- `qwen3`: quicktok's Qwen3 vocabulary (`<think>`, `</think>`, `<tool_call>` are single tokens).
- `harmony`: quicktok's o200k_harmony vocabulary (all Harmony markers are single tokens).
"""

from __future__ import annotations

import pytest

from tests.constrain.support import Vocab


@pytest.fixture(scope="session")
def qwen25_tokenizer(request):
    from transformers import AutoTokenizer

    cache = request.config.cache.mkdir("jaxchat_qwen25_tokenizer")
    if (cache / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(str(cache))
    from jaxchat.assets import AssetError, asset_path

    try:
        p = asset_path("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    except AssetError as e:
        pytest.skip(str(e))
    tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
    tok.save_pretrained(str(cache))
    return tok


@pytest.fixture(scope="session")
def vocabs(qwen25_tokenizer):
    """name -> Vocab (engine + encode/decode), built lazily."""
    return {
        "qwen25": lambda: Vocab.hf(qwen25_tokenizer, vocab_size=151936, stops=(151645, 151643)),
        "qwen3": lambda: Vocab.quicktok("qwen3", stops=("<|im_end|>", "<|endoftext|>")),
        "harmony": lambda: Vocab.quicktok("o200k_harmony", stops=("<|return|>", "<|call|>", "<|endoftext|>")),
    }


_BUILT: dict = {}


@pytest.fixture(scope="session")
def vocab(vocabs):
    def get(name: str) -> Vocab:
        if name not in _BUILT:
            _BUILT[name] = vocabs[name]()
        return _BUILT[name]

    return get


@pytest.fixture(scope="session")
def qwen25(vocab):
    return vocab("qwen25")
