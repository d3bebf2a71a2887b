"""Row moves on the device state: one batch row's KV cache, counts and prompt mask copied onto another.

Contract: pure functions over a `step.DecodeState` (any NamedTuple with `cache_k`, `cache_v`, `counts`,
`prompt_mask`), which `StepRunner` jits with the state donated. `cache_axis` is the cache buffers' batch
axis; `chunks` how many leading chunk buffers of each layer a move touches (None: the whole cache; an int
only for the unrolled layout, a tuple of layers each a tuple of chunks (or empty), where `StepRunner` checks that the
chunks end at its span buckets).
- `leading_chunks(cache, chunks)`: the part of a cache tree a move touches.
- `move_row(state, src, dst, ...)`: row `dst` := row `src`.
- `read_row(state, a, ...)`: row `a` as a one-row state, its cache cut to the leading chunks.
- `write_row(state, row, b, ...)`: row `b` := `row` (as `read_row` returned it).
A swap is `read_row(a)`, `move_row(b -> a)`, `write_row(b)`: three in-place programs, because one program
swapping both rows made XLA:CPU copy the whole cache (35x slower than a move).
"""

from __future__ import annotations

import jax


def leading_chunks(cache, chunks: int | None):
    return cache if chunks is None else tuple(tuple(layer[:chunks]) for layer in cache)


def _map_leading(fn, cache, chunks: int | None, *rows):
    """`fn` over each buffer of the leading chunks (and the matching buffers of `rows`); the rest kept."""
    part = jax.tree.map(fn, leading_chunks(cache, chunks), *rows)
    return part if chunks is None else tuple(
        tuple(new) + tuple(layer[chunks:]) for layer, new in zip(cache, part, strict=True))


def _slice_row(x, row, axis: int):
    return jax.lax.dynamic_slice_in_dim(x, row, 1, axis=axis)


def _put_row(x, value, row, axis: int):
    return jax.lax.dynamic_update_slice_in_dim(x, value, row, axis=axis)


def move_row(state, src, dst, cache_axis: int = 1, chunks: int | None = None):
    def mv(x, axis=cache_axis):
        return _put_row(x, _slice_row(x, src, axis), dst, axis)

    return state._replace(cache_k=_map_leading(mv, state.cache_k, chunks),
                          cache_v=_map_leading(mv, state.cache_v, chunks),
                          counts=mv(state.counts, 0), prompt_mask=mv(state.prompt_mask, 0))


def read_row(state, a, cache_axis: int = 1, chunks: int | None = None):
    def cut(x, axis=cache_axis):
        return _slice_row(x, a, axis)

    return state._replace(cache_k=jax.tree.map(cut, leading_chunks(state.cache_k, chunks)),
                          cache_v=jax.tree.map(cut, leading_chunks(state.cache_v, chunks)),
                          counts=cut(state.counts, 0), prompt_mask=cut(state.prompt_mask, 0))


def write_row(state, row, b, cache_axis: int = 1, chunks: int | None = None):
    def put(x, value, axis=cache_axis):
        return _put_row(x, value, b, axis)

    return state._replace(cache_k=_map_leading(put, state.cache_k, chunks, row.cache_k),
                          cache_v=_map_leading(put, state.cache_v, chunks, row.cache_v),
                          counts=put(state.counts, row.counts, 0),
                          prompt_mask=put(state.prompt_mask, row.prompt_mask, 0))
