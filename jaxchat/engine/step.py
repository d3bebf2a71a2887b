"""The ragged step: one program family over a flat batch of query tokens, its device state and warm-up.

Contract:
- The runner runs the model as its `StepModel` (`jaxchat.models.StepModel`) describes it: the layout, the
  params in that layout, the forward over a ragged step (`jaxchat.models.kv`), the pool builder, the optional
  vocab-major head builder. Attention goes through `backend` (`attention_xla.XlaAttention`: pages of
  `page_size` tokens).
- Device state (`DeviceState`, donated into every program): the KV pool (`num_pages` pages; page 0 is never
  handed out: padding reads it), per-slot generated-token counts int32[slots, V] and prompt-token masks
  bool[slots, V] (the penalties), and each slot's last sampled token int32[slots]; slots = max_batch (a request
  holds one slot from admission to its end; a model's recurrent state lives per slot too).
- `run(rows)` runs one step: rows[i] is a `RowInput` (its slot, the tokens it runs from position `start` on,
  its page table covering them, whether its counts and prompt mask restart, which positions are prompt and
  which are counted outputs, whether it samples, its bitmask row (None: unconstrained) and sampling values,
  and `feed`: its first token is the one last sampled in its slot, still on the device). Every row's tokens are
  one flat batch; each token's K/V is written into its row's pages, attention reads each row's pages up to its
  own length (`forward_step`), then each row's last token's logits are masked and sampled (`sample_step`,
  `sampler`). Returns host `SampleOut` arrays with one row per input row (a row that does not sample: ignore
  its token).
- The same step in three calls, so the host can work while the device runs (the engine's overlapped loop):
  `launch(rows)` dispatches the forward (its logits stay on the device), `sample(rows)` dispatches the sampler
  over the last launch's logits (the rows' masks, sampling values and `samples` read now: they may have
  changed since the launch), `fetch(logprobs)` waits for the last sample and returns its host arrays (the
  logprob arrays only when asked: zeros otherwise). A row fed from the device must have sampled in its slot in
  an earlier `sample` call. `run(rows)` is the three in a row.
- Host inputs travel packed: a forward takes one int32 array (every per-token and per-row input, unpacked by
  static slices inside the program), a sampler one int32 and one float32 array and the bitmask; a step in
  which no row has a mask passes an all-ones bitmask kept on the device (no mask is transferred;
  `mask_transfers` counts the steps that sent one).
- Programs, all compiled by `warmup()` (lowered for exactly the arguments a call passes; after it no call
  compiles): forwards `ProgramKey.decode(R)` where every row runs one token (R in `decode_rows`) and
  `ProgramKey.ragged(T, R)` for any other step (T in `token_buckets`, R in `ragged_rows`, R <= T), and one
  sampler `ProgramKey.sample(R)` per row count, which every forward of R rows shares. A model with recurrent layers
  (`StepModel.prefix_reuse` False) has ragged programs of one row only (`ragged_rows` (1,)): the scheduler
  gives it decode steps and one-row chunks. `program_keys()` lists them; `shape_for(rows)` picks a forward.
- On CPU a `LoadedModel` describes the "unrolled" layout (per-layer weights and pools, the layer loop
  unrolled) and a vocab-major copy of the lm head (kept next to the params under "head_vd") that programs of
  more than one row use for the logits (XLA:CPU's GEMM runs [V, d] . x^T faster than x . [d, V] at several
  rows; one row is faster the other way).
- Forward programs compile with `compile_level.step_compiler_options(params)`: XLA's defaults, or its lowest
  level for a model below the test run's size threshold (the options are part of each program's
  executable-store key); samplers always with XLA's defaults (their vocab-wide loops run far slower unoptimised).
- Warm-up also runs the small programs once (`PRIME_TOKENS`): on XLA:CPU a program's first run is slower than
  the next ones. Those runs write nothing (no slot, no page).
- Sharding: params keep the shardings they arrive with (on a multi-process mesh, global arrays: every process
  runs the same programs, see `step_link`, and reads the replicated outputs locally); pool arrays are sharded
  over the mesh axis "tp" on their kv-head axis (where the backend's layout has it, `pool_head_axis`; a state's
  channel axis) when it divides, else a KV pool on its page axis (more devices than kv heads: each device holds
  num_pages / devices pages; the engine makes the page count divide); everything else is replicated. The
  device state is created in place by one jitted program with those output shardings (never whole on one
  device). `abstract_arrays=True`: params and state are `jax.ShapeDtypeStruct`s with those shardings and
  nothing is allocated; `lower(key, platform)` lowers a program for another platform (`engine.lowering`);
  `compile(key)` compiles one (or loads it from the executable store) without keeping it (`engine.pool_plan`
  reads its memory analysis).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxchat.bitmask import mask_words
from jaxchat.engine.compile_level import step_compiler_options
from jaxchat.engine.compiles import counted_here
from jaxchat.engine.executables import ExecutableStore
from jaxchat.engine.plan import RowInput
from jaxchat.engine.program_catalogue import ProgramCatalogue
from jaxchat.engine.program_key import ProgramKey
from jaxchat.engine.sampler import SampleOut, sample
from jaxchat.engine.step_args import (
    SampleArgs,
    StepArgs,
    forward_args,
    pack_sample,
    pack_step,
    sample_args,
    unpack_sample,
    unpack_step,
)
from jaxchat.models.base import StepModel
from jaxchat.models.kv import StepInputs

PRIME_TOKENS = 64  # warm-up runs each program of at most this many tokens once
HEAD_VD = "head_vd"  # the runner's extra params entry: the lm head stored vocab-major, for several rows


class DeviceState(NamedTuple):
    pools: Any  # the model's pools (`StepModel.new_pools`)
    counts: jax.Array  # i32[slots, V]
    prompt_mask: jax.Array  # bool[slots, V]
    last_tokens: jax.Array  # i32[slots]: the token each slot sampled last (what a `feed` row runs)


def pow2_buckets(lo: int, hi: int) -> tuple[int, ...]:
    out, b = [], lo
    while b < hi:
        out.append(b)
        b *= 2
    out.append(hi)
    return tuple(out)


def make_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A 1-D mesh (axis "tp") over `devices`, by default every device of the runtime: all processes' devices
    when several processes joined it (`cluster.join_cluster`), process by process in order."""
    devs = np.array(list(devices) if devices is not None else jax.devices())
    return Mesh(devs, ("tp",))


def mesh_platform(mesh: Mesh) -> str:
    """The platform of the mesh's devices ("cpu", "gpu", "tpu"), or "mixed" when they differ."""
    platforms = {d.platform for d in mesh.devices.flat}
    return platforms.pop() if len(platforms) == 1 else "mixed"


def pool_shardings(pools: Any, mesh: Mesh, head_axis: int, num_pages: int, kv_head_axis: int | None = None,
                   page_axis: int | None = None) -> Any:
    """The shardings of the pool arrays `pools` on the engine's 1-D 'tp' `mesh`. A KV pool array (its `page_axis`
    `num_pages` long; default the axis before `head_axis`) on its kv-head axis (`kv_head_axis`, default
    `head_axis`: the backend's layout says where) when it divides by the device count, else on its page axis when
    the pages divide, else replicated; any other array (a recurrent state) on `head_axis` (its channels) when it
    divides, else replicated. `StepRunner` places its pools so, and model tests (`tests/models/paged.py`) place
    theirs with it."""
    n_dev = mesh.devices.size
    kv_head_axis = head_axis if kv_head_axis is None else kv_head_axis
    page_axis = head_axis - 1 if page_axis is None else page_axis

    def sharding(x) -> NamedSharding:
        kv = x.ndim > max(page_axis, kv_head_axis) and x.shape[page_axis] == num_pages
        heads = kv_head_axis if kv else head_axis
        if x.ndim > heads and x.shape[heads] % n_dev == 0:
            axis = heads  # kv heads (or state channels)
        elif n_dev > 1 and kv and num_pages % n_dev == 0:
            axis = page_axis  # more devices than kv heads: the pages
        else:
            return NamedSharding(mesh, P())
        return NamedSharding(mesh, P(*("tp" if a == axis else None for a in range(x.ndim))))

    return jax.tree.map(sharding, pools)


def abstract(tree: Any, shardings: Any) -> Any:
    """`tree`'s arrays as `jax.ShapeDtypeStruct`s with `shardings` (for lowering without allocating)."""
    return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), tree, shardings)


def split_vocab_major_head(params) -> tuple[Any, jax.Array | None]:
    """(the model's params, the runner's vocab-major head copy or None)."""
    if isinstance(params, dict) and HEAD_VD in params:
        return {k: v for k, v in params.items() if k != HEAD_VD}, params[HEAD_VD]
    return params, None


def forward_step(params, state: DeviceState, ints, *, forward: Callable, uniform: tuple[int, int] | None,
                 shape: tuple[int, int, int, int]) -> tuple[DeviceState, jax.Array]:
    """A step's forward as one XLA program: the model over the flat batch (writing its K/V into the pool), the
    rows' logits at their last tokens, and the penalty state of the tokens it ran (a fresh row's counts and
    prompt mask restart; prompt positions join the prompt mask, counted positions the counts). `ints` is
    `pack_step`'s array for `shape` (T, R, pages per row, logits positions). Pure; `StepRunner` jits it with the state donated."""
    args = unpack_step(ints, *shape)
    params, head_vd = split_vocab_major_head(params)
    r = args.step.kv_lens.shape[0]
    extra = {"head_vd": head_vd} if head_vd is not None and args.logits_index.shape[0] > 1 else {}
    step = args.step
    slots_n = state.counts.shape[0]
    rows, pos = step.token_rows, step.positions
    slot = jnp.take(step.state_slots, rows)
    tokens = jnp.where(args.feed, jnp.take(state.last_tokens, slot, mode="clip"), args.tokens)
    logits, pools = forward(params, tokens, state.pools, step, uniform=uniform, logits_index=args.logits_index,
                            **extra)
    live = jnp.arange(r, dtype=jnp.int32) < step.num_rows[0]
    fresh = jnp.where(live & args.fresh, step.state_slots, slots_n)
    counts = state.counts.at[fresh].set(0, mode="drop")
    pmask = state.prompt_mask.at[fresh].set(False, mode="drop")
    prompt = (pos >= 0) & (pos < args.prompt_len[rows])
    counted = (pos >= 0) & (pos >= args.count_from[rows])
    pmask = pmask.at[jnp.where(prompt, slot, slots_n), tokens].set(True, mode="drop")
    counts = counts.at[jnp.where(counted, slot, slots_n), tokens].add(1, mode="drop")
    return DeviceState(pools, counts, pmask, state.last_tokens), logits


def sample_step(state: DeviceState, logits, ints, floats, bitmask, *, valid_vocab: int
                ) -> tuple[DeviceState, SampleOut]:
    """Sample every row's next token from its logits (`sampler.sample`: mask, penalties from its slot's counts
    and prompt mask, temperature, truncation, seeded draw); where the row samples, count the token and keep it
    as its slot's last token. `ints`, `floats`: `pack_sample`'s arrays. Pure; jitted per row bucket with the
    state donated."""
    slots, samples, sampling, draft, bias = unpack_sample(ints, floats, logits.shape[0])
    slots_n = state.counts.shape[0]
    counts = jnp.take(state.counts, slots, axis=0, mode="clip")
    pmask = jnp.take(state.prompt_mask, slots, axis=0, mode="clip")
    out = sample(logits, bitmask, counts, pmask, sampling, valid_vocab, draft=draft, bias=bias)
    counted = jnp.where(samples & (slots < slots_n), slots, slots_n)
    return state._replace(counts=state.counts.at[counted, out.tokens].add(1, mode="drop"),
                          last_tokens=state.last_tokens.at[counted].set(out.tokens, mode="drop")), out


class StepRunner:
    """Owns the device state and the compiled programs for one model, slot count, pool and context length."""

    def __init__(self, model: StepModel, *, max_batch: int, max_context: int, vocab_size: int, valid_vocab: int,
                 mesh: Mesh, backend: Any, num_pages: int, token_buckets: Sequence[int],
                 decode_rows: Sequence[int], ragged_rows: Sequence[int], verify_buckets: Sequence[int] = (),
                 executables: ExecutableStore | None = None, abstract_arrays: bool = False,
                 short_first: bool = False) -> None:
        self.vocab_size, self.valid_vocab = vocab_size, valid_vocab
        self.mask_words = mask_words(vocab_size)
        self.max_batch, self.max_context = max_batch, max_context
        self.backend, self.page_size, self.num_pages = backend, backend.page_size, num_pages
        self.pages_per_row = -(-max_context // self.page_size)
        self.prefix_reuse = model.prefix_reuse
        self.catalogue = ProgramCatalogue(token_buckets, decode_rows, ragged_rows, verify_buckets, max_batch,
                                          model.prefix_reuse, short_first=short_first)
        c = self.catalogue
        self.token_buckets, self.decode_rows, self.ragged_rows = c.token_buckets, c.decode_rows, c.ragged_rows
        self.verify_buckets = c.verify_buckets
        self.mesh, self.layout, self.executables = mesh, model.layout, executables
        self._compiled: dict[ProgramKey, Any] = {}
        self.released = False
        rep = NamedSharding(mesh, P())
        params = model.params
        if model.vocab_major_head is not None and max(self.decode_rows + self.ragged_rows) > 1:
            params = {**params, HEAD_VD: model.vocab_major_head(params, mesh)}
        b, v, stacked = max_batch, vocab_size, model.layout == "stacked"

        def zero_state() -> DeviceState:
            pools = model.new_pools(backend, num_pages, self.page_size, max_batch)
            return DeviceState(pools, jnp.zeros((b, v), jnp.int32), jnp.zeros((b, v), jnp.bool_),
                               jnp.zeros((b,), jnp.int32))

        shapes = jax.eval_shape(zero_state)
        head_axis = 2 if stacked else 1  # state channels of a recurrent state array (kv heads of an xla pool)
        kv_head_axis = backend.pool_head_axis + stacked
        state_sh = DeviceState(pool_shardings(shapes.pools, mesh, head_axis, num_pages, kv_head_axis,
                                              page_axis=int(stacked)), rep, rep, rep)
        param_sh = jax.tree.map(lambda x: getattr(x, "sharding", None) or rep, params)
        # what `compile` lowers over: never the live state, which the engine thread donates step by step
        self._abstract_args = (abstract(params, param_sh), abstract(shapes, state_sh))
        if abstract_arrays:  # lowering only: nothing is allocated
            self.params, self.state = self._abstract_args
        else:  # the pool is created in place, each device its own shard
            self.params = jax.device_put(params, param_sh)
            self.state = jax.jit(zero_state, out_shardings=state_sh)()
        self._rep = rep
        forward = functools.partial(model.forward, backend=backend)
        self.compiler_options = step_compiler_options(model.params)
        self._programs: dict[ProgramKey, Any] = {}
        for key in self.program_keys():
            if key.is_sampler:
                fn = functools.partial(sample_step, valid_vocab=valid_vocab)
                self._programs[key] = jax.jit(fn, donate_argnums=(0,), in_shardings=(state_sh, rep, rep, rep, rep),
                                              out_shardings=(state_sh, rep), compiler_options=self._options_of(key) or None)
                continue
            uniform = (key.rows, 1) if key.kind == "decode" else (1, key.tokens) if key.rows == 1 else None
            fn = functools.partial(forward_step, forward=forward, uniform=uniform, shape=self._shape(key))
            self._programs[key] = jax.jit(fn, donate_argnums=(1,), in_shardings=(param_sh, state_sh, rep),
                                          out_shardings=(state_sh, rep), compiler_options=self._options_of(key) or None)
        self._ones: dict[int, jax.Array] = {}  # the all-ones bitmask of each row count, on the device
        self._launched: tuple[ProgramKey, int] | None = None  # the last launch's program key and row count
        self._logits: jax.Array | None = None
        self._out: tuple[SampleOut, int] | None = None  # the last sample's device outputs and row count
        self.mask_transfers = 0  # samples that sent a bitmask from the host

    # ---- programs (`program_catalogue.ProgramCatalogue`) -----------------------------------------------
    def program_keys(self) -> list[ProgramKey]:
        return self.catalogue.program_keys()

    def first_keys(self) -> list[ProgramKey]:
        return self.catalogue.first_keys()

    @property
    def selective(self) -> bool:
        """True: a step runs only programs already compiled (`adopt`), chunked into them when its own is not
        ready; False: any program, compiled at its first call if `warmup` did not."""
        return self.catalogue.selective

    @selective.setter
    def selective(self, value: bool) -> None:
        self.catalogue.selective = value

    def adopt(self, key: ProgramKey, compiled: Any) -> None:
        """Make compiled program `key` one the steps may run (from any thread; a released runner ignores it). One
        adopted after `warmup` is not run ahead of its first step: the engine's thread runs nothing of its own
        accord, so code that drives an idle engine's runner directly (notebooks) may."""
        if self.released:
            return
        self._compiled[key] = compiled
        self.catalogue.ready(key)

    def programs_ready(self) -> int:
        """How many programs are compiled (or loaded)."""
        return len(self._compiled)

    @property
    def max_step_tokens(self) -> int:
        return self.catalogue.max_step_tokens

    @property
    def max_step_rows(self) -> int:
        return self.catalogue.max_step_rows

    @property
    def max_verify_tokens(self) -> int:
        return self.catalogue.max_verify_tokens

    def shape_for(self, n_rows: int, n_tokens: int, verify: bool = False) -> ProgramKey | None:
        return self.catalogue.shape_for(n_rows, n_tokens, verify)

    def _shape(self, key: ProgramKey) -> tuple[int, int, int, int]:
        """(tokens, rows, pages per row, logits positions) of a forward program."""
        return key.tokens, key.rows, self.pages_per_row, key.samples

    # ---- host packing ---------------------------------------------------------------------------------
    def pack(self, key: ProgramKey, rows: Sequence[RowInput]) -> tuple[StepArgs, SampleArgs]:
        """The forward's and the sampler's arguments for `rows` (every array padded to the program's shape)."""
        return self.pack_forward(key, rows), self.pack_sample(key, rows)

    def pack_forward(self, key: ProgramKey, rows: Sequence[RowInput]) -> StepArgs:
        t, r, width, _ = self._shape(key)
        return forward_args(key, rows, t, r, width, self.page_size, self.max_batch, self.max_context)

    def pack_sample(self, key: ProgramKey, rows: Sequence[RowInput]) -> SampleArgs:
        return sample_args(key, rows, self.max_batch, self.mask_words)

    # ---- running ---------------------------------------------------------------------------------------
    def run(self, rows: Sequence[RowInput]) -> SampleOut:
        """Run one step over `rows`; host outputs, one row per input row."""
        self.launch(rows)
        self.sample(rows)
        return self.fetch(logprobs=any(bool(row.sampling.logprobs) for row in rows))

    def launch(self, rows: Sequence[RowInput]) -> ProgramKey:
        """Dispatch the forward of a step over `rows` (not waiting for it); returns its program key."""
        key = self.shape_for(len(rows), sum(len(row.tokens) for row in rows), any(row.drafts for row in rows))
        if key is None:
            raise ValueError(f"no step program takes {len(rows)} rows of {sum(len(r.tokens) for r in rows)} tokens")
        self._forward(key, self.pack_forward(key, rows))
        self._launched = (key, len(rows))
        return key

    def sample(self, rows: Sequence[RowInput]) -> None:
        """Dispatch the sampler over the last launch's logits (`rows`: that launch's rows, as they are now)."""
        if self._launched is None:
            raise RuntimeError("sample() without a launch() before it")
        key, n = self._launched
        if len(rows) != n:
            raise ValueError(f"{len(rows)} rows to sample after a launch of {n}")
        used = sum(len(row.tokens) for row in rows) if key.kind == "verify" else n
        self._sample(key.samples, self.pack_sample(key, rows), used)
        self._launched = None

    def fetch(self, logprobs: bool = False) -> SampleOut:
        """The last sample's outputs on the host, one row per row (waits for it); `logprobs` False: the logprob
        arrays are zeros (not transferred)."""
        if self._out is None:
            raise RuntimeError("fetch() without a sample() before it")
        out, n = self._out
        tokens = np.asarray(out.tokens)[:n]
        if logprobs:
            return SampleOut(tokens, *(np.asarray(x)[:n] for x in out[1:]))
        return SampleOut(tokens, np.zeros(n, np.float32), np.zeros((n, *out.top_ids.shape[1:]), np.int32),
                         np.zeros((n, *out.top_logprobs.shape[1:]), np.float32))

    def _forward(self, key: ProgramKey, args: StepArgs) -> None:
        self.state, self._logits = self._program(key)(self.params, self.state, pack_step(args))

    def _sample(self, r: int, args: SampleArgs, n: int = 0) -> None:
        ints, floats = pack_sample(args)
        if args.bitmask is None:
            bitmask = self._ones.get(r)
            if bitmask is None:
                bitmask = self._ones[r] = jax.device_put(np.full((r, self.mask_words), -1, np.int32), self._rep)
        else:
            bitmask = args.bitmask
            self.mask_transfers += 1
        self.state, out = self._program(ProgramKey.sample(r))(self.state, self._logits, ints, floats, bitmask)
        self._logits = None
        self._out = (out, n)

    def _program(self, key: ProgramKey):
        return self._compiled.get(key) or self._programs[key]

    def _options_of(self, key: ProgramKey) -> dict:
        """The compiler options of program `key`: the samplers (vocab-wide elementwise work) always XLA's own."""
        return {} if key.is_sampler else self.compiler_options

    def _example(self, key: ProgramKey, abstract_state: bool = False) -> tuple:
        """The arguments a call of program `key` passes (for lowering); `abstract_state`: the params and state as
        their shapes and shardings (safe from any thread)."""
        params, state = self._abstract_args if abstract_state else (self.params, self.state)
        if not key.is_sampler:
            return params, state, pack_step(self.pack_forward(key, []))
        logits = jax.ShapeDtypeStruct((key.rows, self.vocab_size), jnp.float32)
        ints, floats = pack_sample(self.pack_sample(key, []))
        return state, logits, ints, floats, np.full((key.rows, self.mask_words), -1, np.int32)

    def lower(self, key: ProgramKey, platform: str | None = None):
        """Program `key` lowered for exactly the arguments a call passes, for `platform` (None: the mesh's own)."""
        traced = self._programs[key].trace(*self._example(key))
        return traced.lower(lowering_platforms=(platform,)) if platform else traced.lower()

    def compile(self, key: ProgramKey, on_lowered: Callable[[], None] | None = None) -> Any:
        """Program `key` compiled for exactly the arguments a call passes (or loaded from the executable store);
        not kept: `warmup` (or `adopt`) keeps what it compiles. From any thread: it lowers over the state's shapes.
        `on_lowered()` runs once it is lowered or loaded (the rest, XLA's compile, leaves the GIL free)."""
        program, args = self._programs[key], self._example(key, abstract_state=True)
        if self.executables is None:
            lowered = program.lower(*args)
            if on_lowered is not None:
                on_lowered()
            return lowered.compile()
        identity = (f"{key.name}|valid_vocab={self.valid_vocab}|layout={self.layout}|backend={self.backend}"
                    f"|options={sorted(self._options_of(key).items())}")
        return self.executables.load_or_compile(identity, program, args, on_lowered)

    def warmup(self, progress: Callable[[ProgramKey, float], None] | None = None, prime: bool = True,
               keys: Sequence[ProgramKey] | None = None, workers: int = 1,
               lowered: Callable[[], None] | None = None) -> None:
        """Compile every program (or `keys` only) ahead of time (lowered for exactly the arguments `run` passes,
        then jit reuses the executable), or load it from the executable store / persistent compilation cache;
        `workers` of them at once, on threads. `prime`: then run once each step of at most `PRIME_TOKENS` tokens
        on empty rows (nothing written), so no request pays a program's first-run cost. Not on a multi-process
        mesh (every process would have to run them in step). `progress(key, seconds)` is called after each
        program, with the seconds it took; `lowered()` once, as soon as every program is lowered or loaded (from
        then on the warm-up mostly leaves the GIL free), from whichever thread got there."""
        keys = list(self.program_keys() if keys is None else keys)
        each_lowered = countdown(len(keys), lowered)
        compile_one = functools.partial(self.compile, on_lowered=each_lowered)
        for key, compiled, seconds in compile_each(compile_one, keys, workers):
            self.adopt(key, compiled)
            if progress is not None:
                progress(key, seconds)
        if prime and jax.process_count() == 1:
            for key in keys:
                if not key.is_sampler and key.tokens <= PRIME_TOKENS and key.sampler() in self._compiled:
                    self._forward(key, self.pack_forward(key, []))
                    self._sample(key.samples, self.pack_sample(key, []))
            jax.block_until_ready(self.state)
            self._out = None

    def release(self) -> None:
        """Drop the device state and compiled programs (the engine is being closed)."""
        self.released = True
        self._compiled.clear()
        self._programs.clear()
        self._ones.clear()
        self.state = self.params = self._logits = self._out = None


def countdown(n: int, then: Callable[[], None] | None) -> Callable[[], None] | None:
    """A callable (thread-safe) that runs `then()` at its `n`-th call; with `n` 0, `then()` runs now."""
    if then is None:
        return None
    if n <= 0:
        then()
        return None
    left, lock = [n], threading.Lock()

    def tick() -> None:
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if last:
            then()

    return tick


def compile_each(compile_one: Callable[[ProgramKey], Any], keys: Sequence[ProgramKey], workers: int = 1):
    """(key, compiled, seconds) for each of `keys`, in their order, compiled by `workers` threads at once (XLA
    compiles outside the GIL); the first failure is raised after the compiles under way end."""
    from concurrent.futures import ThreadPoolExecutor

    def timed(key: ProgramKey) -> tuple[ProgramKey, Any, float]:
        start = time.perf_counter()
        compiled = compile_one(key)
        return key, compiled, time.perf_counter() - start

    if workers <= 1 or len(keys) <= 1:
        yield from map(timed, keys)
        return
    with ThreadPoolExecutor(min(workers, len(keys)), thread_name_prefix="jaxchat-compile") as pool:
        yield from pool.map(counted_here(timed), keys)  # the pool's compiles count as the caller's


def uniform_inputs(batch: int, length: int, page_size: int, start: int = 0, context: int | None = None) -> StepInputs:
    """A uniform step without a scheduler (benchmarks, examples): `batch` rows of `length` tokens each at positions
    start.., row i in its own consecutive pages from 1 + i * pages_per_row on (`context` positions a row may
    reach, default start + length). Host arrays; the pool needs 1 + batch * pages_per_row pages."""
    context = context or start + length
    per_row = -(-context // page_size)
    tables = 1 + np.arange(batch, dtype=np.int32)[:, None] * per_row + np.arange(per_row, dtype=np.int32)[None, :]
    pos = np.broadcast_to(np.arange(start, start + length, dtype=np.int32), (batch, length))
    rows = np.repeat(np.arange(batch, dtype=np.int32), length)
    slots = (tables[rows, pos.reshape(-1) // page_size] * page_size + pos.reshape(-1) % page_size).astype(np.int32)
    return StepInputs(pos.reshape(-1).copy(), rows, np.arange(batch + 1, dtype=np.int32) * length,
                      np.full(batch, start + length, np.int32), tables, slots, np.arange(batch, dtype=np.int32),
                      np.asarray([batch], np.int32))
