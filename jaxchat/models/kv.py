"""What a model's forward sees of one ragged step: the step's inputs, the KV pool's layers, recurrent slots.

Contract:
- A step runs a flat batch of T query tokens from R rows (`StepInputs`): row i's tokens are
  tokens[cu_q_lens[i]:cu_q_lens[i + 1]], at consecutive positions ending at kv_lens[i] - 1; tokens past
  cu_q_lens[num_rows] are padding (position -1: nothing written, output ignored). Row i's K/V lives in
  the pool pages page_tables[i] (position p in page page_tables[i, p // page_size] at offset p % page_size);
  each token's K/V is written at write_slots[t] = page * page_size + offset (-1: not written). A row's
  recurrent state (conv windows, DeltaNet matrices) lives in state slot state_slots[i] of per-slot arrays.
- The forward never allocates or frees pages; the engine's scheduler does, and the attention backend (an
  engine object, see `jaxchat.engine.attention_xla`) owns the pool's layout. The model asks it once per
  step for a `StepAttention` (`backend.begin(step, uniform)`) and each attention layer calls
  `step_attention.attend(pool, layer, q, k, v, scale=, window=, softcap=, sinks=)`: write the token's
  k/v (None: a KV-shared layer that reads another layer's pool) and attend every query token over its
  row's positions <= its own (and > position - window) -> (pool, out [T, H, D]). `layer` indexes a
  stacked pool ([L, ...] arrays, scanned layers) or is None for one layer's own arrays.
- Recurrent layers run on the rows' tokens in a [R, Q] grid, which needs a uniform step
  (`StepAttention.uniform` = (R, Q): every row owns Q consecutive token slots, padding inside them has
  position -1; a decode step is (R, 1), one row's chunk (1, T)). `to_rows` / `from_rows` convert, and
  `read_slots` / `write_slots` gather and scatter the rows' states. A step that is not uniform is an
  error for such a model (the scheduler never builds one).
- `LayerKV(step, layer)` is what a block receives beside its cache: the step's attention and the layer's
  index into a stacked pool (None: per-layer arrays).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp


class StepInputs(NamedTuple):
    """One ragged step's per-token and per-row device arrays (see the module docstring)."""

    positions: jax.Array  # i32[T], -1 = padding
    token_rows: jax.Array  # i32[T]: the step row each token belongs to (padding: 0)
    cu_q_lens: jax.Array  # i32[R + 1]
    kv_lens: jax.Array  # i32[R]: each row's context length once this step's tokens are written
    page_tables: jax.Array  # i32[R, P]
    write_slots: jax.Array  # i32[T]: pool slot of each token's K/V, -1: none
    state_slots: jax.Array  # i32[R]: each row's recurrent-state slot
    num_rows: jax.Array  # i32[1]: rows in use (the rest are padding: q_len 0)


class StepAttention(Protocol):
    uniform: tuple[int, int] | None

    def attend(self, pool: Any, layer: Any, q: jax.Array, k: jax.Array | None, v: jax.Array | None, *,
               scale: float, window: int | None = None, softcap: float | None = None,
               sinks: jax.Array | None = None, local: Any = None) -> tuple[Any, jax.Array]: ...


class AttentionBackend(Protocol):
    name: str

    def new_pool(self, num_pages: int, page_size: int, kv_heads: int, head_dim: int, dtype: Any,
                 layers: int | None = None) -> Any: ...

    def begin(self, step: StepInputs, uniform: tuple[int, int] | None) -> StepAttention: ...


class LayerKV(NamedTuple):
    """A block's handle on the step: its attention, its layer's index into a stacked pool (or None), the step's
    inputs, and the layer's attention window (None: full; with `local`, a traced bool of a scanned stack that
    mixes both kinds, the window applies where it is true)."""

    step: Any  # StepAttention
    layer: Any = None
    inputs: Any = None  # the StepInputs (recurrent layers read positions and state slots)
    window: int | None = None
    local: Any = None


def uniform_of(kv: LayerKV) -> tuple[int, int]:
    shape = kv.step.uniform
    if shape is None:
        raise ValueError("a recurrent layer needs a uniform step (every row the same number of token slots)")
    return shape


def to_rows(x, kv: LayerKV):
    """[1, T, ...] (the flat step) -> [R, Q, ...] (the uniform grid)."""
    r, q = uniform_of(kv)
    return x.reshape(r, q, *x.shape[2:])


def from_rows(y):
    """[R, Q, ...] -> [1, R * Q, ...]."""
    return y.reshape(1, y.shape[0] * y.shape[1], *y.shape[2:])


def read_slots(state, kv: LayerKV):
    """The step rows' states: state [num_slots, ...] at the rows' state slots -> [R, ...]."""
    return jnp.take(state, kv.inputs.state_slots, axis=0, mode="clip")


def write_slots(state, new, kv: LayerKV):
    """`state` with the step rows' new states written at their slots (rows past num_rows left as they are)."""
    rows = jnp.arange(new.shape[0], dtype=jnp.int32)
    slots = jnp.where(rows < kv.inputs.num_rows[0], kv.inputs.state_slots, state.shape[0])
    return state.at[slots].set(new.astype(state.dtype), mode="drop")
