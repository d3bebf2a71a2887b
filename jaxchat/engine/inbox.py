"""What other threads hand the scheduler: submitted requests and aborts, taken at the start of each plan.

Contract: `put(seq)` and `abort(request_id)` may be called from any thread; `size()` (thread-safe) is how many
submitted requests wait to be taken (`request_ids()`: theirs), `busy()` whether a request or an abort waits; `take()` (the engine thread)
returns the requests submitted and the request ids aborted since the last `take()`, in order.
"""

from __future__ import annotations

import collections
import threading
from typing import Any


class Inbox:
    def __init__(self) -> None:
        self._seqs: collections.deque[Any] = collections.deque()
        self._aborts: collections.deque[str] = collections.deque()
        self._lock = threading.Lock()

    def put(self, seq: Any) -> None:
        with self._lock:
            self._seqs.append(seq)

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._aborts.append(request_id)

    def size(self) -> int:
        with self._lock:
            return len(self._seqs)

    def request_ids(self) -> list[str]:
        """The ids of the submitted requests not taken yet (thread-safe)."""
        with self._lock:
            return [seq.req.request_id for seq in self._seqs]

    def busy(self) -> bool:
        with self._lock:
            return bool(self._seqs or self._aborts)

    def take(self) -> tuple[list[Any], set[str]]:
        with self._lock:
            seqs, aborts = list(self._seqs), set(self._aborts)
            self._seqs.clear()
            self._aborts.clear()
        return seqs, aborts
