"""Which step programs a runner has, which are ready, and which one a step runs (no JAX).

Contract (`ProgramCatalogue(token_buckets, decode_rows, ragged_rows, verify_buckets, max_batch, prefix_reuse,
short_first=False)`, one per `step.StepRunner`; keys are `program_key.ProgramKey`s):
- `program_keys()`: every program: decode R for R in `decode_rows`, ragged T x R for T in `token_buckets` and R
  in `ragged_rows` (R <= T), verify T x R likewise, then a sampler for each sampler width they need.
  A model with recurrent layers (`prefix_reuse` False) has ragged programs of one row and no verify programs.
- `first_keys()`: the few programs that serve any request at a fair speed: one ragged program of a middle token
  bucket (the smallest above it that holds `max_batch` rows, if any) over as many rows as it holds, the largest
  decode step (so decoding rows do not each pay a prompt chunk's width), and their samplers. The middle is the
  upper one of an even count, the lower one with `short_first` (an engine on CPU whose wider programs follow in
  the background, `Engine`: there a step's cost grows with its width from the first token, and the first set
  serves the first requests, whose short steps, e.g. a jump-forward insert, must not pay a wide program's cost:
  the 0.5B's 256-token step takes 1.07 s, its 64-token step 0.28 s, for the same cost per token. With programs
  "first" the first set serves for good, and a long prompt's steps are fewer in the wider one).
- `ready(key)`: program `key` is compiled (from any thread). `selective` True: steps keep to ready forwards whose
  sampler is ready too; False: every program may run (compiled at its first call if need be).
- `max_step_tokens`, `max_step_rows`, `max_verify_tokens`: what one step may run now (the scheduler's
  `plan.StepLimits`): with `selective`, within the largest ready programs, so that any step within them has a
  program; `shape_for(rows, tokens, verify)`: the smallest program that fits a step (None: none does).
"""

from __future__ import annotations

from collections.abc import Sequence

from jaxchat.engine.program_key import FORWARD_KINDS, ProgramKey


class ProgramCatalogue:
    def __init__(self, token_buckets: Sequence[int], decode_rows: Sequence[int], ragged_rows: Sequence[int],
                 verify_buckets: Sequence[int], max_batch: int, prefix_reuse: bool,
                 short_first: bool = False) -> None:
        self.max_batch, self.prefix_reuse, self.short_first = max_batch, prefix_reuse, short_first
        self.token_buckets = tuple(sorted(set(token_buckets)))
        self.decode_rows = tuple(sorted({min(int(b), max_batch) for b in decode_rows}))
        rows = ragged_rows if prefix_reuse else (1,)
        self.ragged_rows = tuple(sorted({min(int(b), max_batch) for b in rows}))
        self.verify_buckets = tuple(sorted(set(verify_buckets))) if prefix_reuse else ()
        self.selective = False
        self._ready_keys: set[ProgramKey] = set()
        self._usable: dict[str, tuple] = {}  # with `selective`: the ready forwards of each kind
        self._every = {kind: tuple(k for k in self.program_keys() if k.kind == kind) for kind in FORWARD_KINDS}

    def program_keys(self) -> list[ProgramKey]:
        keys = [ProgramKey.decode(r) for r in self.decode_rows]
        keys += [ProgramKey.ragged(t, r) for t in self.token_buckets for r in self.ragged_rows if r <= t]
        keys += [ProgramKey.verify(t, r) for t in self.verify_buckets for r in self.ragged_rows if r <= t]
        return keys + [ProgramKey.sample(n) for n in sorted({k.samples for k in keys})]

    def first_keys(self) -> list[ProgramKey]:
        buckets = self.token_buckets
        middle = buckets[(len(buckets) - self.short_first) // 2]
        t = next((b for b in buckets if b >= max(middle, self.ragged_rows[-1])), middle)
        keys = [ProgramKey.ragged(t, max(r for r in self.ragged_rows if r <= t)),
                ProgramKey.decode(self.decode_rows[-1])]
        return keys + [ProgramKey.sample(n) for n in sorted({k.samples for k in keys})]

    def ready(self, key: ProgramKey) -> None:
        self._ready_keys.add(key)
        usable = [k for k in self.program_keys() if not k.is_sampler and k in self._ready_keys
                  and k.sampler() in self._ready_keys]
        self._usable = {kind: tuple(k for k in usable if k.kind == kind) for kind in FORWARD_KINDS}

    def _forwards(self, kind: str) -> tuple:
        """The forward programs of `kind` a step may run, in `program_keys` order."""
        return self._usable.get(kind, ()) if self.selective else self._every[kind]

    @property
    def max_step_tokens(self) -> int:
        """With `selective`: the tokens of the largest ready ragged program over `max_step_rows` rows."""
        if not self.selective:
            return self.token_buckets[-1]
        rows = self.max_step_rows if self.prefix_reuse else 1
        return max((k.tokens for k in self._forwards("ragged") if k.rows >= rows), default=0)

    @property
    def max_step_rows(self) -> int:
        """`max_batch`, or with `selective` the most rows of a ready ragged program (models with recurrent layers:
        of a decode step)."""
        if not self.selective:
            return self.max_batch
        kind = "ragged" if self.prefix_reuse else "decode"
        return max((k.rows for k in self._forwards(kind)), default=0)

    @property
    def max_verify_tokens(self) -> int:
        """The most tokens a step with drafts may run (0: no verify program, or none ready): with `selective`, a
        ready verify program that holds as many rows as the speculator lets such a step have (a quarter of its
        tokens, within `max_step_rows`)."""
        if not self.selective:
            return max((k.tokens for k in self._every["verify"]), default=0)
        cap = self.max_step_rows
        return max((k.tokens for k in self._forwards("verify") if k.rows >= min(k.tokens // 4, cap)), default=0)

    def shape_for(self, n_rows: int, n_tokens: int, verify: bool = False) -> ProgramKey | None:
        if verify:
            return next((k for k in self._forwards("verify") if n_tokens <= k.tokens and n_rows <= k.rows), None)
        if n_rows == n_tokens:
            decode = next((k for k in self._forwards("decode") if n_rows <= k.rows), None)
            if decode is not None:
                return decode
        return next((k for k in self._forwards("ragged") if n_tokens <= k.tokens and n_rows <= k.rows), None)
