"""Test helpers: a tiny byte-level BPE tokenizer and a tiny fake model with the `LoadedModel` interface.

The fake forward is one attention layer over the real paged pool (k/v written at each token's position,
causal over its row's positions <= its own, through the engine's jnp backend), so outputs depend on each
row's own history only: enough to test batch isolation, paging and sharding without the cost of a real
model's compile. It describes itself to the step runner as a `StepModel` with one layer's pool. Also: a tiny
random Qwen2 with that tokenizer (`tiny_byte_qwen2`) and a counter of step-runner calls (`count_calls`).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxchat.engine.types import ConstraintBase
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
    global_head_dim: int | None = None
    num_global_kv_heads: int | None = None
    attention_sinks: bool = False


class FakeModel:
    """Implements what the engine uses of `jaxchat.models.LoadedModel`."""

    def __init__(self, tokenizer=None, config: FakeConfig = FakeConfig(), seed: int = 0, eos=(256,)):
        self.config = config
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos)
        self.dtype = jnp.float32
        self.mesh = None
        self.quantize = None
        self.stacked = False  # no stacked-layers layout: the Pallas path's takeover never applies
        r = np.random.default_rng(seed)
        d, v = config.hidden_size, config.vocab_size
        self.params = {
            "embed": jnp.asarray(r.normal(size=(v, d)), jnp.float32),
            "wq": jnp.asarray(r.normal(size=(d, d)) / np.sqrt(d), jnp.float32),
            "wk": jnp.asarray(r.normal(size=(d, d)) / np.sqrt(d), jnp.float32),
            "wv": jnp.asarray(r.normal(size=(d, d)) / np.sqrt(d), jnp.float32),
            "head": jnp.asarray(r.normal(size=(d, v)) * 2, jnp.float32),
        }

    def forward(self, params, tokens, pools, step, backend, *, uniform=None, logits_index=None, head_vd=None):
        c = self.config
        t = tokens.shape[0]
        heads = c.hidden_size // c.head_dim
        x = params["embed"][tokens]
        q = (x @ params["wq"]).reshape(t, heads, c.head_dim)
        k = (x @ params["wk"]).reshape(t, c.num_kv_heads, c.head_dim)
        v = (x @ params["wv"]).reshape(t, c.num_kv_heads, c.head_dim)
        pools, out = backend.begin(step, uniform).attend(pools, None, q, k, v, scale=1 / np.sqrt(c.head_dim))
        h = x + out.reshape(t, -1)
        if logits_index is not None:
            h = h[logits_index]
        return (h @ params["head"]).astype(jnp.float32), pools

    def partition_specs(self, mesh):
        return {"embed": P(), "wq": P(None, "tp"), "wk": P(), "wv": P(), "head": P(None, "tp")}

    def kv_dims(self):
        return [(self.config.num_kv_heads, self.config.head_dim)]

    def new_pools(self, backend, num_pages: int, page_size: int, num_slots: int):
        c = self.config
        return backend.new_pool(num_pages, page_size, c.num_kv_heads, c.head_dim, jnp.float32)

    def step_model(self, params, platform: str) -> StepModel:
        """The same description on every platform: one layer's pool, no vocab-major head."""
        return StepModel(layout="unrolled", params=params, forward=self.forward, new_pools=self.new_pools,
                         vocab_major_head=None)


class ScriptedConstraint(ConstraintBase):
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
