"""Hand outputs from the engine thread to asyncio event loops: one wake-up per loop per engine step.

Contract:
- `Mailbox.post(loop, deliver, on_closed)` (any thread) queues the callable `deliver` to run on `loop`;
  nothing reaches the loop until `flush()`.
- `Mailbox.flush()` (the engine thread, after each step and after a step's prefills) wakes every loop that has pending calls once,
  with one `call_soon_threadsafe` that runs them in posting order. When a loop is already closed its
  calls are dropped and each one's `on_closed()` runs instead, on the flushing thread.
- `flush(wait_s)`: then waits, at most `wait_s`, until every woken loop has run the calls and the iteration
  after them (the tasks they woke: a stream writing its first token). The engine does so with a step's first
  tokens, so on a small host they are written before the next decode step takes every core.

Waking a loop per delta cost one self-pipe write and one loop iteration per row per step; with 16 rows
that stole CPU from the next decode step on a small host.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

Call = Callable[[], None]


def _run_all(calls: list[Call], loop: asyncio.AbstractEventLoop | None = None,
             handed: threading.Event | None = None) -> None:
    for call in calls:
        call()
    if handed is not None:  # set one iteration later: after the tasks these calls woke have run
        loop.call_soon(loop.call_soon, handed.set)


class Mailbox:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[Call, Call]]] = {}

    def post(self, loop: asyncio.AbstractEventLoop, deliver: Call, on_closed: Call) -> None:
        with self._lock:
            self._pending.setdefault(loop, []).append((deliver, on_closed))

    def flush(self, wait_s: float = 0.0) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        handed: list[threading.Event] = []
        for loop, items in pending.items():
            event = threading.Event() if wait_s > 0 else None
            try:
                loop.call_soon_threadsafe(_run_all, [deliver for deliver, _ in items], loop, event)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                for _, on_closed in items:
                    on_closed()
            else:
                if event is not None:
                    handed.append(event)
        deadline = time.monotonic() + wait_s
        for event in handed:
            event.wait(max(deadline - time.monotonic(), 0.0))
