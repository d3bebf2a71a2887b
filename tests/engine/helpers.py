"""Test helpers: a tiny byte-level BPE tokenizer and a tiny fake model with the `LoadedModel` interface.

The fake forward is a one-head attention over the real cache (k/v written at each token's position,
causal over positions <= its own), so outputs depend on each row's own history only: enough to test
batch isolation, slot moves and sharding without the cost of a real model's compile. It describes
itself to the step runner as a `StepModel` of the "stacked" layout without attention spans. Also: a tiny
random Qwen2 with that tokenizer (`tiny_byte_qwen2`) and a counter of step-runner calls (`count_calls`).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxchat.models import StepModel

SPECIALS = ["<|im_end|>", "<tool_call>", "</tool_call>"]


def count_calls(runner, names):
    """Count calls of the runner methods `names` (patched on the instance); returns (counts, restore)."""
    calls = {name: 0 for name in names}
    originals = {name: getattr(runner, name) for name in names}

    def counting(name):
        def call(*args, **kwargs):
            calls[name] += 1
            return originals[name](*args, **kwargs)
        return call

    for name in names:
        setattr(runner, name, counting(name))
    return calls, lambda: [delattr(runner, name) for name in names]


def tiny_byte_qwen2(path):
    """A tiny random Qwen2 (264-token vocabulary) saved with `byte_tokenizer()` at `path`, loaded in float32."""
    from jaxchat.models.load import load_model
    from tests.models.conftest import build_tiny

    build_tiny("qwen2", path, vocab_size=264)
    byte_tokenizer().save_pretrained(path)
    return load_model(path, "float32")


def byte_tokenizer():
    """A byte-level BPE tokenizer: 256 byte tokens, a few merges, three special tokens (ids 256..)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_map = {b: c for b, c in zip(range(256), _bytes_to_unicode(), strict=True)}
    assert set(byte_map.values()) == set(alphabet)
    vocab = {byte_map[b]: b for b in range(256)}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("Ġ", "w")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    fast.add_special_tokens({"additional_special_tokens": SPECIALS})
    return fast


def _bytes_to_unicode() -> list[str]:
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs, strict=True))
    return [chr(table[b]) for b in range(256)]


@dataclass(frozen=True)
class FakeConfig:
    vocab_size: int = 320
    hidden_size: int = 32
    num_layers: int = 2
    num_kv_heads: int = 2
    head_dim: int = 16


class FakeModel:
    """Implements what the engine uses of `jaxchat.models.LoadedModel`."""

    def __init__(self, tokenizer=None, config: FakeConfig = FakeConfig(), seed: int = 0, eos=(256,)):
        self.config = config
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos)
        self.dtype = jnp.float32
        self.mesh = None
        r = np.random.default_rng(seed)
        d, v = config.hidden_size, config.vocab_size
        self.params = {
            "embed": jnp.asarray(r.normal(size=(v, d)), jnp.float32),
            "wq": jnp.asarray(r.normal(size=(d, d)) / np.sqrt(d), jnp.float32),
            "wk": jnp.asarray(r.normal(size=(d, d)) / np.sqrt(d), jnp.float32),
            "wv": jnp.asarray(r.normal(size=(d, d)) / np.sqrt(d), jnp.float32),
            "head": jnp.asarray(r.normal(size=(d, v)) * 2, jnp.float32),
        }

    def forward(self, params, tokens, positions, cache_k, cache_v, *, row_offset=0, logits_index=None):
        c = self.config
        b, t = tokens.shape
        s = cache_k.shape[2]
        x = params["embed"][tokens]
        k = (x @ params["wk"]).reshape(b, t, c.num_kv_heads, c.head_dim)
        v = (x @ params["wv"]).reshape(b, t, c.num_kv_heads, c.head_dim)
        rows = jnp.broadcast_to(jnp.arange(b)[:, None] + row_offset, (b, t))
        pos = jnp.where(positions >= 0, positions, s)
        cache_k = cache_k.at[:, rows, pos].set(jnp.broadcast_to(k, (c.num_layers, b, t) + k.shape[2:]), mode="drop")
        cache_v = cache_v.at[:, rows, pos].set(jnp.broadcast_to(v, (c.num_layers, b, t) + v.shape[2:]), mode="drop")
        keys = jax.lax.dynamic_slice_in_dim(cache_k[-1], row_offset, b, axis=0).reshape(b, s, -1)
        vals = jax.lax.dynamic_slice_in_dim(cache_v[-1], row_offset, b, axis=0).reshape(b, s, -1)
        q = x @ params["wq"]
        scores = jnp.einsum("btd,bsd->bts", q, keys) / np.sqrt(c.hidden_size)
        visible = jnp.arange(s)[None, None, :] <= positions[:, :, None]
        scores = jnp.where(visible, scores, -1e30)
        h = x + jnp.einsum("bts,bsd->btd", jax.nn.softmax(scores, axis=-1), vals)
        if logits_index is not None:
            h = jnp.take_along_axis(h, logits_index[:, None, None], axis=1)
        return (h @ params["head"]).astype(jnp.float32), cache_k, cache_v

    def partition_specs(self, mesh):
        return {"embed": P(), "wq": P(None, "tp"), "wk": P(), "wv": P(), "head": P(None, "tp")}

    def step_model(self, params, platform: str) -> StepModel:
        """The same description on every platform: stacked cache, whole-cache attention, no vocab-major head."""
        return StepModel(layout="stacked", params=params, forward=self.forward,
                         new_cache=lambda batch, max_len, spans: self.empty_cache(batch, max_len),
                         attention_spans=False, vocab_major_head=None)

    def empty_cache(self, batch: int, max_len: int):
        c = self.config
        shape = (c.num_layers, batch, max_len, c.num_kv_heads, c.head_dim)
        return jnp.zeros(shape, jnp.float32), jnp.zeros(shape, jnp.float32)


class ScriptedConstraint:
    """A test constraint: allows only `allowed` ids; terminates after `length` tokens; may raise."""

    def __init__(self, allowed, length: int = 1000, raise_at: int | None = None, mask_words: int = 10):
        self.allowed = sorted(set(allowed))
        self.length, self.raise_at = length, raise_at
        self.accepted: list[int] = []

    def fill_mask(self, row: np.ndarray) -> None:
        if self.raise_at is not None and len(self.accepted) >= self.raise_at:
            raise ValueError("scripted constraint failure")
        row.fill(0)
        for t in self.allowed:
            row[t // 32] |= np.int32(np.uint32(1 << (t % 32)).view(np.int32))

    def accept(self, token: int) -> bool:
        self.accepted.append(token)
        return token in self.allowed

    def is_terminated(self) -> bool:
        return len(self.accepted) >= self.length
