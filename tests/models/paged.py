"""Run [B, T] blocks of tokens through a model's paged forward, for model-level tests.

`PagedRows(lm, rows, max_len)` gives every row its own pages of a small pool (page 0 is left out, as the
engine's allocator does, and the pages of a row are not consecutive) and calls the model's forward with the
jnp backend (`jaxchat.engine.attention_xla.XlaAttention`) over a uniform step of B rows x T token slots:
`rows(tokens, positions) -> logits [B, T, V]` (position -1: padding, its logits are garbage). The pools
persist between calls, so a prefill then one-token calls run through the pages as the engine's steps do.
`run_ragged(rows, runs)` runs one ragged step instead: rows of different token counts packed back to back
(what the engine's steps are), for models whose caches are all positional. `rows(..., first_row=k)` runs the
step's B rows as rows k .. k + B - 1 of the pool (their pages and state slots: the rest are left alone), and
`rows.place(mesh)` puts the pools on the engine's 1-D 'tp' mesh with the engine's own rule
(`jaxchat.engine.step.pool_shardings`: kv heads, or a state's channels, over 'tp' where their count divides, else
the pages, else replicated).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jaxchat.engine.attention_xla import XlaAttention
from jaxchat.engine.compile_level import FAST_COMPILE_OPTIONS, param_count
from jaxchat.models.kv import StepInputs
from tests.conftest import FAST_COMPILE_PARAMS

# A tiny model's programs here run a few times each: compiled with the engine's fast-compile options (XLA's
# lowest backend level, XLA:CPU's loop emitters) their compile time, most of a model test's, drops to about a
# half (tests/models/test_parity.py alone, cold: 181 s -> 105 s; the ops, and so the numbers checked, are the
# same). A real checkpoint's run the other way: its unoptimised steps cost more than the compile saves
# (tests/models/test_real_weights.py 105 s -> 78 s with XLA's defaults), so it compiles as users get it.
TINY_PARAMS = FAST_COMPILE_PARAMS  # one threshold for the suite: tests/conftest.py's


def compiler_options(lm, fast: bool | None = None) -> dict:
    """The fast-compile options for a tiny model (or wherever `fast`), else XLA's defaults."""
    fast = param_count(lm.params) < TINY_PARAMS if fast is None else fast
    return dict(FAST_COMPILE_OPTIONS) if fast else {}


_JITS: dict[tuple, tuple] = {}


def _jitted(lm, backend, layout: str, backend_key: tuple, fast: bool | None) -> tuple:
    """One pair of jitted forwards (uniform, ragged) per model, layout, attention settings and compile options,
    shared by every `PagedRows` of them: a program traced and compiled for one is reused by the next of the same
    shapes."""
    key = (id(lm), layout, backend_key, fast)
    found = _JITS.get(key)
    if found is not None and found[0] is lm:
        return found[1]
    forward = functools.partial(lm.forward, backend=backend, layout=layout)
    options = compiler_options(lm, fast)
    pair = (jax.jit(forward, static_argnames=("uniform",), compiler_options=options),
            jax.jit(forward, compiler_options=options))
    _JITS[key] = (lm, pair)
    return pair


class PagedRows:
    def __init__(self, lm, rows: int, max_len: int, *, page_size: int = 4, layout: str = "stacked", params=None,
                 kv_block: int = 2, query_block: int = 4, seed: int = 0, fast_compile: bool | None = None):
        self.lm, self.rows, self.page_size, self.layout = lm, rows, page_size, layout
        self.params = lm.params if params is None else params
        self.backend = XlaAttention(page_size, kv_block=kv_block, query_block=query_block)
        per_row = -(-max_len // page_size)
        pages = np.random.default_rng(seed).permutation(np.arange(1, rows * per_row + 1))
        self.tables = pages.reshape(rows, per_row).astype(np.int32)
        self.pools = lm.new_pools(self.backend, rows * per_row + 1, page_size, rows, layout)
        self._forward, self.ragged_forward = _jitted(lm, self.backend, layout, (page_size, kv_block, query_block),
                                                     fast_compile)

    def place(self, mesh) -> PagedRows:
        """Put the pools on `mesh`, the engine's 1-D 'tp' mesh (`jaxchat.engine.step.make_mesh`), as its step
        runner does (`jaxchat.engine.step.pool_shardings`): kv heads (or a state's channels) over 'tp' where
        their count divides, else the pages, whose count is rounded up to divide as the engine makes it (the
        extra pages stay unused). Call it before the first step: the pools are made anew."""
        from jaxchat.engine.step import pool_shardings

        assert tuple(mesh.axis_names) == ("tp",), f"the engine's pools live on a 1-D 'tp' mesh, not {mesh}"
        n = mesh.devices.size
        num_pages = -(-(self.tables.size + 1) // n) * n
        self.pools = self.lm.new_pools(self.backend, num_pages, self.page_size, self.rows, self.layout)
        head_axis = 2 if self.layout == "stacked" and self.lm.stacked else 1
        self.pools = jax.device_put(self.pools, pool_shardings(self.pools, mesh, head_axis, num_pages))
        return self

    def step_inputs(self, positions: np.ndarray, first_row: int = 0) -> StepInputs:
        b, t = positions.shape
        pos = positions.reshape(-1).astype(np.int32)
        rows = np.repeat(np.arange(b, dtype=np.int32), t)
        tables = self.tables[first_row:first_row + b]
        assert len(tables) == b, (first_row, b, self.rows)
        slots = np.where(pos >= 0, tables[rows, np.maximum(pos, 0) // self.page_size] * self.page_size
                         + np.maximum(pos, 0) % self.page_size, -1).astype(np.int32)
        return StepInputs(jnp.asarray(pos), jnp.asarray(rows), jnp.asarray(np.arange(b + 1, dtype=np.int32) * t),
                          jnp.asarray(positions.max(axis=1).astype(np.int32) + 1), jnp.asarray(tables),
                          jnp.asarray(slots), jnp.arange(first_row, first_row + b, dtype=jnp.int32),
                          jnp.asarray([b], jnp.int32))

    def __call__(self, tokens, positions, head_vd=None, logits_index=None, first_row: int = 0) -> np.ndarray:
        tokens, positions = np.asarray(tokens, np.int32), np.asarray(positions, np.int32)
        b, t = tokens.shape
        logits, self.pools = self._forward(self.params, jnp.asarray(tokens.reshape(-1)), self.pools,
                                           self.step_inputs(positions, first_row), uniform=(b, t), head_vd=head_vd,
                                           logits_index=logits_index)
        return np.asarray(logits) if logits_index is not None else np.asarray(logits).reshape(b, t, -1)


RAGGED_BUCKETS = (16, 32, 64, 128)  # token counts a ragged step is padded to, as the engine pads its steps


def ragged_inputs(tables: np.ndarray, page_size: int, runs: list[tuple[int, list[int], int]], pad: int = 3):
    """A ragged step (rows packed back to back, then at least `pad` padding tokens, up to the smallest of
    `RAGGED_BUCKETS` that holds them, so steps of different token counts share a program): runs[i] = (the row, its
    tokens, the position of its first token) -> (tokens [T], StepInputs, logits_index [R]: each run's last token)."""
    toks, pos, rows, cu = [], [], [], [0]
    owners = [row for row, _, _ in runs]
    for i, (_, run, start) in enumerate(runs):
        toks += list(run)
        pos += list(range(start, start + len(run)))
        rows += [i] * len(run)
        cu.append(len(toks))
    total = next((b for b in RAGGED_BUCKETS if b >= len(toks) + pad), len(toks) + pad)
    pad = total - len(toks)
    toks += [0] * pad
    pos += [-1] * pad
    rows += [0] * pad
    pos_a, rows_a = np.asarray(pos, np.int32), np.asarray(rows, np.int32)
    own = tables[owners]
    slots = np.where(pos_a >= 0, own[rows_a, np.maximum(pos_a, 0) // page_size] * page_size
                     + np.maximum(pos_a, 0) % page_size, -1).astype(np.int32)
    kv_lens = np.asarray([start + len(run) for _, run, start in runs], np.int32)
    step = StepInputs(jnp.asarray(pos_a), jnp.asarray(rows_a), jnp.asarray(cu, jnp.int32), jnp.asarray(kv_lens),
                      jnp.asarray(own), jnp.asarray(slots), jnp.asarray(owners, jnp.int32),
                      jnp.asarray([len(runs)], jnp.int32))
    return jnp.asarray(toks, jnp.int32), step, jnp.asarray(np.asarray(cu[1:]) - 1, jnp.int32)


def run_ragged(paged: PagedRows, runs: list[tuple[int, list[int], int]], head_vd=None) -> np.ndarray:
    """One ragged step over `paged`'s rows and pools -> the logits at each row's last token [R, V]."""
    tokens, step, index = ragged_inputs(paged.tables, paged.page_size, runs)
    logits, paged.pools = paged.ragged_forward(paged.params, tokens, paged.pools, step, logits_index=index,
                                               head_vd=head_vd)
    return np.asarray(logits)
