"""The token bitmask layout shared by the grammar side (`jaxchat.constrain`) and the engine.

Contract: a bitmask over a vocabulary of V tokens is a row of `mask_words(V)` int32 words; bit j of
word i (least significant first) is token 32*i + j, 1 = allowed; a row of all ones (every word -1)
allows every token. A leaf module (stdlib only), so that the engine and `jaxchat.constrain` share
the layout without importing each other.
"""

from __future__ import annotations

BITS_PER_WORD = 32


def mask_words(vocab_size: int) -> int:
    """int32 words of a bitmask over `vocab_size` tokens: ceil(vocab_size / 32)."""
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD
