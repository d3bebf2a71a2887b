"""A tiny random gpt-oss checkpoint with the REAL o200k_harmony vocabulary and the real gpt-oss chat template:
the Harmony format end to end without real weights.

`harmony_tokenizer()` builds a transformers fast tokenizer from quicktok's bundled o200k_harmony encoding
(the 199,998 byte-level BPE tokens in rank order, merges recovered from the ranks, the o200k
pre-tokenisation pattern, and the 1,090 special tokens at their ids: 201,088 in all); it encodes as quicktok does
(`tests/e2e/test_gpt_oss_harmony.py` checks a sample). `tiny_gpt_oss_model(dir)` writes (once; reused when
present) an HF directory: a 2-layer, hidden-32 random GptOssForCausalLM over the whole 201,088-id
vocabulary, that tokenizer, the template `openai-gpt-oss-120b.jinja` (`jaxchat.assets.template_path`)
and gpt-oss's eos ids (<|return|>, <|endoftext|>, <|call|>).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

O200K_PATTERN = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+(?!\S)",
    r"\s+",
])
TEMPLATE = "openai-gpt-oss-120b.jinja"
EOS = (200002, 199999, 200012)  # <|return|>, <|endoftext|>, <|call|>


def _byte_chars() -> dict[int, str]:
    """GPT-2's byte -> printable character map (byte-level BPE)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def harmony_tokenizer():
    import quicktok
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    enc = quicktok.get_encoding("o200k_harmony")
    by_id: dict[int, str] = {}
    for s in sorted(enc.special_tokens_set, key=lambda s: s.startswith("<|reserved_")):  # named first
        by_id.setdefault(enc.encode_single_token(s), s)  # 200018 is both <|endofprompt|> and a reserved name
    specials = sorted(by_id.items())
    n_bpe = specials[0][0]
    ranks = {enc.decode_single_token_bytes(i): i for i in range(n_bpe)}
    chars = _byte_chars()

    def text(b: bytes) -> str:
        return "".join(chars[x] for x in b)

    merges = []  # every split of a token into two tokens of lower rank, ordered by the merged token's rank
    for token, rank in ranks.items():
        local = [(token[:i], token[i:]) for i in range(1, len(token)) if token[:i] in ranks and token[i:] in ranks]
        local.sort(key=lambda lr: (ranks[lr[0]], ranks[lr[1]]))
        merges += [(rank, text(a), text(b)) for a, b in local]
    merges.sort(key=lambda m: m[0])
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True} for i, s in specials],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": O200K_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {text(t): i for t, i in ranks.items()},
                  "merges": [[a, b] for _, a, b in merges]},
    }
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                   bos_token="<|startoftext|>", eos_token="<|return|>", pad_token="<|endoftext|>")


def tiny_gpt_oss_model(directory: str | Path, seed: int = 0) -> Path:
    out = Path(directory)
    if (out / "config.json").exists() and (out / "tokenizer_config.json").exists():
        return out
    import torch
    from transformers import GptOssConfig, GptOssForCausalLM

    from jaxchat.assets import template_path

    tokenizer = harmony_tokenizer()
    tokenizer.chat_template = template_path(TEMPLATE).read_text()
    tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.manual_seed(seed)
    config = GptOssConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
        max_position_embeddings=131072, bos_token_id=199998, eos_token_id=EOS[0], pad_token_id=199999,
    )
    model = GptOssForCausalLM(config).eval()
    model.generation_config.eos_token_id = list(EOS)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    try:
        tmp.rename(out)
    except OSError:  # another process built it first
        shutil.rmtree(tmp, ignore_errors=True)
    return out
