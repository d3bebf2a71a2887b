"""Which token prefixes the KV cache's idle rows still hold, so a new prompt can start from one.

Contract:
- `ResidentPrefixes(rows)` keeps, per cache row, the token ids whose K/V that row holds at positions
  0..len-1, or nothing. Only idle rows are recorded: the scheduler records a row when its request finishes
  (`record(row, tokens)`: exactly the tokens written, i.e. the prompt and every generated token fed back)
  and forgets it when a request takes the row (`forget(row)`). Row moves and swaps made by the scheduler
  are mirrored with `moved(src, dst)` / `swapped(a, b)`.
- `best(prompt, rows)` -> (row, n): among `rows`, the one sharing the longest common prefix with `prompt`
  and that length, capped at len(prompt) - 1 (the last prompt token is always run, for its logits);
  (-1, 0) when none shares a token. Ties go to the first row given.
- Valid only for caches indexed by position (attention K/V): a row's state at position n must not depend
  on tokens written after n. Recurrent layers (convolution windows, linear attention) break that; the
  engine does not build this for such models.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class ResidentPrefixes:
    def __init__(self, rows: int) -> None:
        self._tokens: list[tuple[int, ...] | None] = [None] * rows

    def record(self, row: int, tokens: Sequence[int]) -> None:
        self._tokens[row] = tuple(tokens) if tokens else None

    def forget(self, row: int) -> None:
        self._tokens[row] = None

    def held(self, row: int) -> tuple[int, ...]:
        return self._tokens[row] or ()

    def moved(self, src: int, dst: int) -> None:
        """Row src was copied onto dst (src keeps its copy)."""
        self._tokens[dst] = self._tokens[src]

    def swapped(self, a: int, b: int) -> None:
        self._tokens[a], self._tokens[b] = self._tokens[b], self._tokens[a]

    def best(self, prompt: Sequence[int], rows: Iterable[int]) -> tuple[int, int]:
        limit = len(prompt) - 1
        best_row, best_len = -1, 0
        for row in rows:
            held = self._tokens[row]
            if held is None:
                continue
            n = min(common_prefix_length(held, prompt), limit)
            if n > best_len:
                best_row, best_len = row, n
        return best_row, best_len
