"""A step's host arguments: built from its rows, and packed into arrays to travel to the device.

Contract:
- `forward_args(key, rows, ...) -> StepArgs`: the forward program's inputs for `rows` (`plan.RowInput`): the
  flat batch of tokens with their positions, rows and KV write slots, each row's page table, length, state slot
  and logits position, padded to the program's shape; `sample_args(key, rows, ...) -> SampleArgs`: the sampler's
  (slots, which rows sample, the bitmask rows, the sampling arrays, the drafts a verify step checks, the logit
  bias). A row that does not fit its program or its context is a ValueError.
- `pack_step` / `unpack_step` and `pack_sample` / `unpack_sample`: those arguments as one int32 array (and one
  float32 array for the sampler), read back inside the program by static slices.
- Programs are named by `program_key.ProgramKey`s.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxchat.engine.plan import RowInput, positions_of
from jaxchat.engine.program_key import ProgramKey
from jaxchat.engine.sampler import SamplingArrays
from jaxchat.engine.types import LOGIT_BIAS_SLOTS
from jaxchat.models.kv import StepInputs


class StepArgs(NamedTuple):
    """A forward program's host arguments besides params and state (packed into one int32 array to travel)."""

    tokens: np.ndarray
    step: StepInputs
    logits_index: np.ndarray
    fresh: np.ndarray
    prompt_len: np.ndarray
    count_from: np.ndarray
    feed: np.ndarray  # bool[T]: the token is its slot's last sampled one (device), not tokens[t]


class SampleArgs(NamedTuple):
    """A sampling program's host arguments besides the state and the logits."""

    slots: np.ndarray  # i32[R]: each row's slot (padding rows: the slot count, written nowhere)
    samples: np.ndarray  # bool[R]: the row's sampled token is its next one (counted)
    bitmask: np.ndarray | None  # i32[R, W]; None: no row has a mask (the device's all-ones one is used)
    sampling: SamplingArrays
    draft: np.ndarray  # i32[R]: the drafted token this position verifies (-1: none), `sampler.sample`
    bias_ids: np.ndarray  # i32[R, LOGIT_BIAS_SLOTS] (-1: no entry), `sampler.sample`
    bias_values: np.ndarray  # f32[R, LOGIT_BIAS_SLOTS]


def _step_fields(t: int, r: int, p: int, n: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The int32 fields of a packed forward input (T tokens, R rows, P pages a row, logits at N tokens), in order,
    with their shapes."""
    return (("tokens", (t,)), ("positions", (t,)), ("token_rows", (t,)), ("write_slots", (t,)), ("feed", (t,)),
            ("cu_q_lens", (r + 1,)), ("kv_lens", (r,)), ("state_slots", (r,)), ("logits_index", (n,)),
            ("fresh", (r,)), ("prompt_len", (r,)), ("count_from", (r,)), ("num_rows", (1,)), ("page_tables", (r, p)))


_BOOL_FIELDS = ("feed", "fresh")


def pack_step(args: StepArgs) -> np.ndarray:
    """A forward's host inputs as one int32 array (`unpack_step` reads it back inside the program)."""
    values = {**args._asdict(), **args.step._asdict()}
    t, (r, p), n = args.tokens.shape[0], args.step.page_tables.shape, args.logits_index.shape[0]
    return np.concatenate([np.asarray(values[name], np.int32).reshape(-1) for name, _ in _step_fields(t, r, p, n)])


def unpack_step(ints, t: int, r: int, p: int, n: int) -> StepArgs:
    """`pack_step` undone (static slices: works on a traced array)."""
    out, at = {}, 0
    for name, shape in _step_fields(t, r, p, n):
        n = int(np.prod(shape))
        value = ints[at:at + n].reshape(shape)
        out[name] = value != 0 if name in _BOOL_FIELDS else value
        at += n
    step = StepInputs(*(out[f] for f in StepInputs._fields))
    return StepArgs(out["tokens"], step, out["logits_index"], out["fresh"], out["prompt_len"], out["count_from"],
                    out["feed"])


_SAMPLE_INTS = ("top_k", "seed", "step", "logprobs", "draft")
_SAMPLE_FLOATS = ("temperature", "top_p", "min_p", "presence", "frequency", "repetition")


def pack_sample(args: SampleArgs) -> tuple[np.ndarray, np.ndarray]:
    """A sampler's host inputs but the bitmask as one int32 and one float32 array (`unpack_sample`)."""
    sp = args.sampling._asdict() | {"draft": args.draft}
    ints = [np.asarray(args.slots, np.int32), np.asarray(args.samples, np.int32)]
    ints += [np.asarray(sp[f]).astype(np.uint32 if f == "seed" else np.int32).view(np.int32) for f in _SAMPLE_INTS]
    ints.append(np.asarray(args.bias_ids, np.int32).ravel())
    floats = [np.asarray(sp[f], np.float32) for f in _SAMPLE_FLOATS] + [np.asarray(args.bias_values, np.float32).ravel()]
    return np.concatenate(ints), np.concatenate(floats)


def unpack_sample(ints, floats, r: int) -> tuple[jax.Array, jax.Array, SamplingArrays, jax.Array, tuple]:
    """(slots, samples, sampling arrays, drafts, logit bias) from `pack_sample`'s arrays (static slices)."""
    col = {name: ints[(2 + i) * r:(3 + i) * r] for i, name in enumerate(_SAMPLE_INTS)}
    col["seed"] = jax.lax.bitcast_convert_type(col["seed"], jnp.uint32)
    col["logprobs"] = col["logprobs"] != 0
    col.update({name: floats[i * r:(i + 1) * r] for i, name in enumerate(_SAMPLE_FLOATS)})
    draft = col.pop("draft")
    at_i, at_f, k = (2 + len(_SAMPLE_INTS)) * r, len(_SAMPLE_FLOATS) * r, LOGIT_BIAS_SLOTS
    bias = ints[at_i:at_i + r * k].reshape(r, k), floats[at_f:at_f + r * k].reshape(r, k)
    return ints[:r], ints[r:2 * r] != 0, SamplingArrays(**col), draft, bias


def forward_args(key: ProgramKey, rows: Sequence[RowInput], t: int, r: int, width: int, page_size: int, max_batch: int,
                 max_context: int) -> StepArgs:
    """The forward's arguments for `rows` in a program of `t` tokens over `r` rows of `width` pages each (every
    array padded to it); a ValueError when the rows do not fit it or a row its context."""
    n = sum(len(row.tokens) for row in rows)
    if len(rows) > r or n > t:
        raise ValueError(f"{len(rows)} rows of {n} tokens do not fit the step program {key}")
    ps = page_size
    tokens, positions = np.zeros(t, np.int32), np.full(t, -1, np.int32)
    token_rows, write_slots = np.zeros(t, np.int32), np.full(t, -1, np.int32)
    feed = np.zeros(t, np.bool_)
    cu, kv_lens = np.zeros(r + 1, np.int32), np.zeros(r, np.int32)
    tables, state_slots = np.zeros((r, width), np.int32), np.full(r, max_batch, np.int32)
    index, fresh = np.zeros(r, np.int32), np.zeros(r, np.bool_)
    prompt_len, count_from = np.zeros(r, np.int32), np.zeros(r, np.int32)
    at = 0
    for i, row in enumerate(rows):
        k, end = len(row.tokens), row.start + len(row.tokens)
        if k == 0 or row.start < 0 or end > max_context or len(row.pages) * ps < end:
            raise ValueError(f"row {i}: {k} tokens from position {row.start} with {len(row.pages)} pages of "
                             f"{ps} do not fit the context of {max_context}")
        span = slice(at, at + k)
        tokens[span], positions[span] = row.tokens, np.arange(row.start, end, dtype=np.int32)
        token_rows[span] = i
        feed[at] = row.feed
        table = np.asarray(row.pages, np.int32)
        write_slots[span] = table[positions[span] // ps] * ps + positions[span] % ps
        tables[i, :len(table)] = table
        at += k
        cu[i + 1:] = at
        kv_lens[i], state_slots[i], index[i], fresh[i] = end, row.slot, at - 1, row.fresh
        prompt_len[i], count_from[i] = row.prompt_len, row.count_from
    step = StepInputs(positions, token_rows, cu, kv_lens, tables, write_slots, state_slots,
                      np.asarray([len(rows)], np.int32))
    if key.kind == "verify":
        index = np.arange(t, dtype=np.int32)
    return StepArgs(tokens, step, index, fresh, prompt_len, count_from, feed)


def sample_args(key: ProgramKey, rows: Sequence[RowInput], max_batch: int, mask_words: int) -> SampleArgs:
    """The sampler's arguments for `rows` (one position per row, or every token of a verify step)."""
    n = key.samples
    slots, samples = np.full(n, max_batch, np.int32), np.zeros(n, np.bool_)
    draft = np.full(n, -1, np.int32)
    bias_ids, bias_values = np.full((n, LOGIT_BIAS_SLOTS), -1, np.int32), np.zeros((n, LOGIT_BIAS_SLOTS), np.float32)
    masked = any(row.mask is not None for row in rows)
    bitmask = np.full((n, mask_words), -1, np.int32) if masked else None
    sp = SamplingArrays.numpy(n)
    for row, where in zip(rows, positions_of(key, rows), strict=True):
        own = where[-(row.drafts + 1):]  # the positions it samples at: its last, or one per draft and after
        for j, i in enumerate(own):
            slots[i] = row.slot
            samples[i] = row.samples and not row.drafts
            if j < row.drafts:
                draft[i] = row.tokens[len(row.tokens) - row.drafts + j]
            if masked and row.mask is not None:
                bitmask[i] = row.mask[j] if row.drafts else row.mask
            for field, full, value in zip(SamplingArrays._fields, sp, row.sampling, strict=True):
                full[i] = value + j if field == "step" else value
            for b, (token, value) in enumerate(row.bias):
                bias_ids[i, b], bias_values[i, b] = token, value
    return SampleArgs(slots, samples, bitmask, sp, draft, bias_ids, bias_values)
