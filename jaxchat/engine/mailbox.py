"""Hand outputs from the engine thread to asyncio event loops: one wake-up per loop per engine step.

Contract:
- `Mailbox.post(loop, deliver, on_closed)` (any thread) queues the callable `deliver` to run on `loop`;
  nothing reaches the loop until `flush()`.
- `Mailbox.flush()` (the engine thread, after each step and after a step's prefills) wakes every loop that has pending calls once,
  with one `call_soon_threadsafe` that runs them in posting order. When a loop is already closed its
  calls are dropped and each one's `on_closed()` runs instead, on the flushing thread.

Waking a loop per delta cost one self-pipe write and one loop iteration per row per step; with 16 rows
that stole CPU from the next decode step on a small host.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

Call = Callable[[], None]


def _run_all(calls: list[Call]) -> None:
    for call in calls:
        call()


class Mailbox:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[Call, Call]]] = {}

    def post(self, loop: asyncio.AbstractEventLoop, deliver: Call, on_closed: Call) -> None:
        with self._lock:
            self._pending.setdefault(loop, []).append((deliver, on_closed))

    def flush(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        for loop, items in pending.items():
            try:
                loop.call_soon_threadsafe(_run_all, [deliver for deliver, _ in items])
            except RuntimeError:  # the loop is closed: nobody is listening any more
                for _, on_closed in items:
                    on_closed()
