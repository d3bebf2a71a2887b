"""A process-wide XLA compile counter.

Contract: `compile_count()` is the number of XLA backend compilations (of any jitted function or eager op,
in any thread) since this module was imported; `compiled_names()` lists the function names compiled, in
order. It listens to JAX's `/jax/core/compile/backend_compile_duration` monitoring event, which JAX records
around every backend compile (a persistent-cache hit still counts: it is a compile request at run time).
`cache_hit_count()` is how many of them the persistent compilation cache answered (JAX's
`/jax/compilation_cache/cache_hits` event): `compile_count() - cache_hit_count()` were compiled for real.

`Tally` counts the same events for one owner (an engine): only those in threads inside its `counting()`
block (JAX compiles in the thread that calls the program), so engines side by side in one process each see
their own compiles; `counted_here(fn)` carries the calling thread's tallies to whichever thread runs `fn`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from jax import monitoring

_EVENT = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT = "/jax/compilation_cache/cache_hits"
_lock = threading.Lock()
_names: list[str] = []
_cache_hits = [0]
_local = threading.local()  # .tallies: the `Tally`s counting in this thread
T = TypeVar("T")


class Tally:
    """Compiles and persistent-cache hits in the threads inside `counting()` (see the module docstring)."""

    def __init__(self) -> None:
        self.compiles = 0
        self.cache_hits = 0

    @contextmanager
    def counting(self) -> Iterator[Tally]:
        """Count this thread's compiles while inside the block."""
        tallies = _local.__dict__.setdefault("tallies", [])
        tallies.append(self)
        try:
            yield self
        finally:
            tallies.remove(self)


def counted_here(fn: Callable[..., T]) -> Callable[..., T]:
    """`fn`, counting its compiles, in whichever thread runs it, into the tallies counting in the calling thread
    (work handed to a thread pool)."""
    tallies = list(_thread_tallies())

    def run(*args, **kwargs) -> T:
        mine = _local.__dict__.setdefault("tallies", [])
        mine.extend(tallies)
        try:
            return fn(*args, **kwargs)
        finally:
            for tally in tallies:
                mine.remove(tally)

    return run


def _thread_tallies() -> list[Tally]:
    return _local.__dict__.get("tallies", [])


def _listener(event: str, duration_secs: float, **kwargs) -> None:
    if event == _EVENT:
        with _lock:
            _names.append(str(kwargs.get("fun_name", "?")))
            for tally in _thread_tallies():
                tally.compiles += 1


def _hit_listener(event: str, **kwargs) -> None:
    if event == _CACHE_HIT:
        with _lock:
            _cache_hits[0] += 1
            for tally in _thread_tallies():
                tally.cache_hits += 1


monitoring.register_event_duration_secs_listener(_listener)
monitoring.register_event_listener(_hit_listener)


def compile_count() -> int:
    with _lock:
        return len(_names)


def compiled_names(since: int = 0) -> list[str]:
    with _lock:
        return list(_names[since:])


def cache_hit_count() -> int:
    with _lock:
        return _cache_hits[0]
