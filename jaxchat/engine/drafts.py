"""Prompt-lookup drafts for speculative decoding: propose the tokens that followed the latest earlier occurrence of
the context's last n tokens, and keep each row's draft length adaptive.

Contract:
- `NgramIndex(max_n=4, min_n=2)`: per request, over its token sequence (prompt, then outputs).
  `propose(tokens, k)` returns up to k tokens: for n from max_n down to min_n, the tokens that followed the
  most recent earlier occurrence of tokens[-n:] (that occurrence ending before the last token), from the longest
  n that has one; [] when none does. The index grows with the sequence (each position hashed once per n), so a
  proposal costs O(max_n) dictionary lookups plus the indexing of the tokens added since the last call.
- `DraftLength(k_max)`: how many tokens a row drafts next. It starts at `k_max`; a verification that accepts
  every draft doubles it (up to k_max), one that accepts fewer halves it towards what was accepted (at
  least 1); after `STOP_AFTER` verifications in a row that accept nothing the row stops drafting for a pause
  (`pause`, doubling each time, up to `MAX_PAUSE` decode tokens), then tries again at k = 2.
"""

from __future__ import annotations

from collections.abc import Sequence

STOP_AFTER = 3
FIRST_PAUSE = 8
MAX_PAUSE = 256


class NgramIndex:
    def __init__(self, max_n: int = 4, min_n: int = 2) -> None:
        self.max_n, self.min_n = max_n, min_n
        self._last: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]  # n -> n-gram -> end index
        self._indexed = 0  # n-grams ending before this index are in the maps

    def _index_upto(self, tokens: Sequence[int], end: int) -> None:
        for i in range(self._indexed, end):
            for n in range(self.min_n, self.max_n + 1):
                if i + 1 >= n:
                    self._last[n][tuple(tokens[i + 1 - n:i + 1])] = i
        self._indexed = max(self._indexed, end)

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        length = len(tokens)
        if k <= 0 or length < self.min_n + 1:
            return []
        self._index_upto(tokens, length - 1)  # every n-gram ending before the last token
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            end = self._last[n].get(tuple(tokens[length - n:]))
            if end is not None:
                return list(tokens[end + 1:end + 1 + k])
        return []


class DraftLength:
    def __init__(self, k_max: int) -> None:
        self.k_max = k_max
        self.k = k_max
        self.misses = 0  # verifications in a row that accepted nothing
        self.pause = 0  # decode tokens left without drafting
        self.next_pause = FIRST_PAUSE

    @property
    def active(self) -> bool:
        return self.k_max > 0 and self.pause == 0

    def tick(self) -> None:
        """A token was decoded without drafting."""
        if self.pause > 0:
            self.pause -= 1
            if self.pause == 0:
                self.k = min(2, self.k_max)

    def verified(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        if accepted == drafted:
            self.k = min(self.k_max, 2 * self.k)
            self.misses, self.next_pause = 0, FIRST_PAUSE
            return
        self.k = max(1, min(self.k, (self.k + accepted) // 2 if accepted else self.k // 2))
        self.misses = self.misses + 1 if accepted == 0 else 0
        if self.misses >= STOP_AFTER:
            self.pause, self.misses = self.next_pause, 0
            self.next_pause = min(MAX_PAUSE, 2 * self.next_pause)
