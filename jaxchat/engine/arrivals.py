"""Requests on their way to the engine: announced by the HTTP layer, counted until they are submitted.

Contract:
- `Arrivals.expect()` (any thread; the server calls it when a generation request comes in, before reading
  its body) returns an `Arrival` and makes it the current one of the calling context (a `ContextVar`, so the
  tasks the request's handler starts inherit it).
- `Arrivals.submitted()` (called by `Engine.submit`) closes the current context's arrival, if it is one of
  this `Arrivals`: the request it announced has reached the engine. `Arrival.close()` closes it too (idempotent): the request
  ended without submitting (a 400, a client gone). Closing wakes `on_change` (the engine's condition).
- `Arrivals.pending(within_s)` counts the open arrivals announced less than `within_s` ago; older ones are
  forgotten, so an arrival nobody closed cannot hold a later burst.

Why: a closed loop's next wave (16 clients whose streams ended in the same step) reaches the engine spread
over tens of milliseconds, as the event loop reads, renders and tokenizes each request in turn. An idle engine
woken by the first of them gathers the burst (`Engine._gather_burst`); knowing which requests are still being
read lets it wait for exactly those instead of guessing from the gaps between submissions.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable

_CURRENT: contextvars.ContextVar[Arrival | None] = contextvars.ContextVar("jaxchat_arrival", default=None)


class Arrival:
    def __init__(self, owner: Arrivals) -> None:
        self._owner = owner
        self.at = time.monotonic()

    def close(self) -> None:
        self._owner._close(self)


class Arrivals:
    def __init__(self, on_change: Callable[[], None] = lambda: None) -> None:
        self._lock = threading.Lock()
        self._open: dict[Arrival, None] = {}  # insertion-ordered: oldest first
        self._on_change = on_change

    def expect(self) -> Arrival:
        arrival = Arrival(self)
        with self._lock:
            self._open[arrival] = None
        _CURRENT.set(arrival)
        return arrival

    def submitted(self) -> None:
        arrival = _CURRENT.get()
        if arrival is not None and arrival._owner is self:  # another engine's announcement is not ours to close
            arrival.close()

    def pending(self, within_s: float) -> int:
        oldest = time.monotonic() - within_s
        with self._lock:
            while self._open and next(iter(self._open)).at < oldest:
                del self._open[next(iter(self._open))]
            return len(self._open)

    def _close(self, arrival: Arrival) -> None:
        with self._lock:
            closed = arrival in self._open
            self._open.pop(arrival, None)
        if closed:
            self._on_change()
