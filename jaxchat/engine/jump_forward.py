"""Jump-forward's token boundary: which tokens to append for text a grammar forces.

Contract: `forced_token_ids(encode, decode, prev, text)` returns the token ids of `text` (the only
continuation the grammar admits after the token `prev`) as the model's tokenizer spells them when they follow
`prev`: `encode(decode([prev]) + text)` less its first token, when that is `prev` itself. Where the tokenizer
would merge the start of `text` into `prev` (the model chose `"` where `",` was possible), that token is
already emitted, so the text is spelled on its own: `encode(text)`. The last token is always left out, since
the tokenizer could merge it with whatever follows the forced text (the model samples it, under the mask).
`encode(str) -> ids` must add no special tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def forced_token_ids(encode: Callable[[str], Sequence[int]], decode: Callable[[list[int]], str], prev: int,
                     text: str) -> list[int]:
    if not text:
        return []
    ids = list(encode(decode([prev]) + text))
    ids = ids[1:] if ids and ids[0] == prev else list(encode(text))
    return ids[:-1]
