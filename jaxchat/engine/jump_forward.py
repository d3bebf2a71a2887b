"""Jump-forward's token boundary: which tokens to append for text a grammar forces.

Contract: `forced_token_ids(encode, decode, prev, text)` returns the token ids of `text` (the only
continuation the grammar admits after the token `prev`) as the model's tokenizer spells them when they follow
`prev`: `encode(decode([prev]) + text)` must start with `prev` itself (otherwise the spelling would merge text
into `prev`, a token the model already emitted, and nothing is forced: the model samples the next token and
the jump is tried again after it). The last token is left out too, since the tokenizer could merge it with
whatever follows the forced text. `encode(str) -> ids` must add no special tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def forced_token_ids(encode: Callable[[str], Sequence[int]], decode: Callable[[list[int]], str], prev: int,
                     text: str) -> list[int]:
    if not text:
        return []
    ids = list(encode(decode([prev]) + text))
    if len(ids) < 3 or ids[0] != prev:
        return []
    return ids[1:-1]
