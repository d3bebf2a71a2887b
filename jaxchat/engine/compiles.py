"""A process-wide XLA compile counter.

Contract: `compile_count()` is the number of XLA backend compilations (of any jitted function or eager op,
in any thread) since this module was imported; `compiled_names()` lists the function names compiled, in
order. It listens to JAX's `/jax/core/compile/backend_compile_duration` monitoring event, which JAX records
around every backend compile (a persistent-cache hit still counts: it is a compile request at run time).
"""

from __future__ import annotations

import threading

from jax import monitoring

_EVENT = "/jax/core/compile/backend_compile_duration"
_lock = threading.Lock()
_names: list[str] = []


def _listener(event: str, duration_secs: float, **kwargs) -> None:
    if event == _EVENT:
        with _lock:
            _names.append(str(kwargs.get("fun_name", "?")))


monitoring.register_event_duration_secs_listener(_listener)


def compile_count() -> int:
    with _lock:
        return len(_names)


def compiled_names(since: int = 0) -> list[str]:
    with _lock:
        return list(_names[since:])
