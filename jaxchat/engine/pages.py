"""The KV pool's bookkeeping on the host: which pages are free, who holds them, and the prefix cache.

Contract:
- `PagePool(num_pages, page_size, prefix_caching=True, salt=b"")`: pages 1..num_pages-1 are handed out (page
  0 is the padding page the step reads for nothing, never given to a row). `allocate(n)` returns n pages
  (reference count 1) or None when fewer can be had; `release(pages)` drops one reference of each.
- Prefix caching: a full page is keyed by a hash chain of its tokens: key(page i) = blake2b(key(page i - 1) +
  its `page_size` token ids), key(-1) = `salt` (the model's identity), so a key names the whole prefix up to
  the page's end. `register(pages, tokens, done)` records the full pages of a row whose K/V are written
  (`tokens`: the row's tokens from position 0 on whose K/V it holds; `done` carries the chain on from the
  previous call, so a long row hashes each page once); `match(tokens, limit)`
  returns the longest run of cached pages that starts the token sequence (at most `limit` pages) and takes a
  reference to each, without copying anything. A page keyed once keeps its key while in use; a second page
  with the same content is not keyed (it is freed when released).
- A page no row references goes back to the free list, or, if keyed, to the LRU list of cached pages:
  `allocate` takes free pages first, then evicts cached pages least recently released (their keys are
  dropped). `available()` counts both; `used()` is the pages some row holds.
- Without prefix caching nothing is keyed and `match` finds nothing. `reset_cache()` forgets every key (after
  a failed step, whose writes may be partial); pages in use stay in use.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Sequence

import numpy as np


class PagePool:
    def __init__(self, num_pages: int, page_size: int, prefix_caching: bool = True, salt: bytes = b"") -> None:
        if num_pages < 2:
            raise ValueError(f"a pool needs at least 2 pages (page 0 is reserved), not {num_pages}")
        self.num_pages, self.page_size = num_pages, page_size
        self.prefix_caching, self.salt = prefix_caching, salt
        self.refs = np.zeros(num_pages, np.int32)
        self._free: collections.deque[int] = collections.deque(range(1, num_pages))
        self._lru: collections.OrderedDict[int, None] = collections.OrderedDict()  # keyed pages nobody holds
        self._key_of: dict[int, bytes] = {}
        self._page_of: dict[bytes, int] = {}
        self.hits = 0  # pages `match` handed out

    # ---- counts ---------------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Pages a row can ever hold (all but the padding page)."""
        return self.num_pages - 1

    def available(self) -> int:
        return len(self._free) + len(self._lru)

    def used(self) -> int:
        return self.capacity - self.available()

    def cached(self) -> int:
        """Keyed pages (held or not)."""
        return len(self._key_of)

    def pages_for(self, tokens: int) -> int:
        return -(-tokens // self.page_size)

    # ---- allocation -------------------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int] | None:
        if n > self.available():
            return None
        out = []
        for _ in range(n):
            if self._free:
                page = self._free.popleft()
            else:
                page, _ = self._lru.popitem(last=False)
                del self._page_of[self._key_of.pop(page)]
            self.refs[page] = 1
            out.append(page)
        return out

    def release(self, pages: Sequence[int]) -> None:
        for page in pages:
            self.refs[page] -= 1
            if self.refs[page] > 0:
                continue
            if self.refs[page] < 0:
                raise RuntimeError(f"page {page} released more often than it was taken")
            if page in self._key_of:
                self._lru[page] = None
            else:
                self._free.append(page)

    # ---- prefix cache -------------------------------------------------------------------------------------
    def _key(self, prev: bytes, page_tokens: Sequence[int]) -> bytes:
        return hashlib.blake2b(prev + np.asarray(page_tokens, np.int64).tobytes(), digest_size=16).digest()

    def match(self, tokens: Sequence[int], limit: int) -> list[int]:
        """The longest run of cached pages starting `tokens` (at most `limit`), each with a reference taken."""
        if not self.prefix_caching or limit <= 0:
            return []
        out, key, ps = [], self.salt, self.page_size
        for i in range(min(limit, len(tokens) // ps)):
            key = self._key(key, tokens[i * ps:(i + 1) * ps])
            page = self._page_of.get(key)
            if page is None:
                break
            out.append(page)
        for page in out:
            if self.refs[page] == 0:
                self._lru.pop(page, None)
            self.refs[page] += 1
        self.hits += len(out)
        return out

    def register(self, pages: Sequence[int], tokens: Sequence[int], done: tuple[int, bytes] | None = None
                 ) -> tuple[int, bytes]:
        """Key the full pages of a row past those `done` covers: `tokens` (from position 0 on) are those whose
        K/V the row holds. `done` = (pages already keyed, the chain key after them), None at first; returns it
        for the next call."""
        count, key = done if done is not None else (0, self.salt)
        if not self.prefix_caching:
            return count, key
        ps = self.page_size
        for i in range(count, min(len(pages), len(tokens) // ps)):
            key = self._key(key, tokens[i * ps:(i + 1) * ps])
            count = i + 1
            page = pages[i]
            if page not in self._key_of and key not in self._page_of:
                self._key_of[page], self._page_of[key] = key, page
        return count, key

    def reset_cache(self) -> None:
        for page in list(self._lru):
            self._free.append(page)
        self._lru.clear()
        self._key_of.clear()
        self._page_of.clear()
