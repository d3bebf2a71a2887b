"""Which token prefixes the KV cache's idle rows still hold, and which row a new prompt should take.

Contract:
- `ResidentPrefixes(rows)` keeps, per cache row, the token ids whose K/V that row holds at positions
  0..len-1, or nothing. Only idle rows are recorded: the scheduler records a row when its request finishes
  (`record(row, tokens)`: exactly the tokens written, i.e. the prompt and every generated token fed back)
  and forgets it when a request takes the row (`forget(row)`). Row swaps made by the scheduler are
  mirrored with `swapped(a, b)`.
- `plan(prompt, rows)` -> `Placement(row, source, length)` for a prompt about to take one of the idle
  `rows`: `length` prompt tokens can be reused (the longest common prefix with any record, capped at
  len(prompt) - 1: the last prompt token is always run, for its logits), from row `source` (-1: none).
  `row` is the row the request should overwrite: the source itself when the prompt reuses at least half of
  its record (the same conversation going on), otherwise a row holding nothing, else one of the rows least
  recently recorded or used (`tick()` starts each scheduler step; rows of the same step count as equally old):
  of those `rows[0]` (where the scheduler places the request: no swap), then one holding the prefix (no
  copy), then the first recorded. When `row` does not hold the prefix, the scheduler copies it over from
  `source`, which keeps its record for the conversation it belongs to. A burst of requests repeating one
  prompt, as the rows of the burst before it finished together, so takes those rows in place.
- Valid only for caches indexed by position (attention K/V): a row's state at position n must not depend
  on tokens written after n. Recurrent layers (convolution windows, linear attention) break that; the
  engine does not build this for such models.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


def common_prefix_length(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if diff.size else n


class Placement(NamedTuple):
    row: int  # the idle row the request takes
    source: int  # the row holding the reusable prefix (-1: none)
    length: int  # prompt tokens reused


class ResidentPrefixes:
    def __init__(self, rows: int) -> None:
        self._tokens: list[np.ndarray | None] = [None] * rows
        # when each row was last recorded or reused from: (scheduler step, order within it), for LRU eviction
        self._used = [(0, 0)] * rows
        self._step = 0
        self._clock = 0

    def tick(self) -> None:
        """A new scheduler step: rows recorded or used from now on are newer than those before."""
        self._step += 1

    def _touch(self, row: int) -> None:
        self._clock += 1
        self._used[row] = (self._step, self._clock)

    def record(self, row: int, tokens: Sequence[int]) -> None:
        self._tokens[row] = np.asarray(tokens, np.int64) if len(tokens) else None
        self._touch(row)

    def forget(self, row: int) -> None:
        self._tokens[row] = None

    def held(self, row: int) -> tuple[int, ...]:
        t = self._tokens[row]
        return () if t is None else tuple(int(x) for x in t)

    def length(self, row: int) -> int:
        """How many leading positions of `row` its record covers (0: none)."""
        t = self._tokens[row]
        return 0 if t is None else len(t)

    def swapped(self, a: int, b: int) -> None:
        self._tokens[a], self._tokens[b] = self._tokens[b], self._tokens[a]
        self._used[a], self._used[b] = self._used[b], self._used[a]

    def plan(self, prompt: Sequence[int], rows: Sequence[int]) -> Placement:
        rows = list(rows)
        p = np.asarray(prompt, np.int64)
        limit = len(p) - 1
        match = {r: 0 if (held := self._tokens[r]) is None else min(common_prefix_length(held, p), limit)
                 for r in rows}
        length = max(match.values(), default=0)
        holders = [r for r in rows if length and match[r] == length]
        for r in holders:
            if 2 * length >= len(self._tokens[r]):  # the same conversation going on: its own row
                self._touch(r)
                return Placement(r, r, length)
        empty = [r for r in rows if self._tokens[r] is None]
        if empty:
            target = empty[0]
        else:
            # the least recently used step's rows; of those, the one that needs the least copying (rows[0],
            # where the request goes, then a row holding the prefix), then the oldest
            oldest = min(self._used[r][0] for r in rows)
            spare = [r for r in rows if self._used[r][0] == oldest]
            target = min(spare, key=lambda r: (r != rows[0], r not in holders, self._used[r][1]))
        source = target if target in holders else (holders[0] if holders else -1)
        if source >= 0:
            self._touch(source)
        return Placement(target, source, length)
