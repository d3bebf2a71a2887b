"""Session fixtures: real vocabularies and one GrammarEngine per vocabulary (built once, they are slow).

- `qwen25`: the default model's tokenizer (Qwen2.5 GGUF; its HF form is cached in the jaxchat cache,
  so only the first session pays the GGUF read); markers like `<think>` are spelled out.
- `qwen3`: quicktok's Qwen3 vocabulary (`<think>`, `</think>`, `<tool_call>` are single tokens).
- `harmony`: quicktok's o200k_harmony vocabulary (all Harmony markers are single tokens).
- `qwen25_markers`: a copy of the default model's tokenizer whose spare ids (its `[PAD151665]` ...
  entries, below the 151,936 logits) hold the markers of llama3_json, mistral and deepseek_v3 (and
  `<think>`, `</think>`) as special tokens: no Llama 3.1, Mistral or DeepSeek tokenizer is available
  offline, and in theirs these markers are single tokens too.
"""

from __future__ import annotations

import pytest

from tests.constrain.support import ADDED_MARKERS, ADDED_STOPS, Vocab, tokenizer_with_markers


@pytest.fixture(scope="session")
def qwen25_tokenizer():
    from jaxchat.assets import DEFAULT_MODEL, AssetError, asset_path
    from jaxchat.models.gguf_loader import gguf_tokenizer

    try:
        path = asset_path(DEFAULT_MODEL)
    except AssetError as e:
        pytest.skip(str(e))
    return gguf_tokenizer(path, None)  # the GGUF's tokenizer, its conversion cached in the jaxchat cache


def _qwen25_with_markers(tokenizer):
    tokenizer = tokenizer_with_markers(tokenizer, ADDED_MARKERS, first_id=151665)
    stops = (151645, 151643, *tokenizer.convert_tokens_to_ids(list(ADDED_STOPS)))
    return Vocab.hf(tokenizer, vocab_size=151936, stops=stops)


@pytest.fixture(scope="session")
def vocabs(qwen25_tokenizer):
    """name -> Vocab (engine + encode/decode), built lazily."""
    return {
        "qwen25": lambda: Vocab.hf(qwen25_tokenizer, vocab_size=151936, stops=(151645, 151643)),
        "qwen25_markers": lambda: _qwen25_with_markers(qwen25_tokenizer),
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
