"""Releasing a test file's compiled programs (tests/conftest.py calls it after each file).

Contract: `release_compiled_programs()` collects garbage and clears JAX's caches of traced, lowered and compiled
programs, so the XLA:CPU executables nothing else references are freed with the memory mappings of their code
(a no-op when JAX was never imported). `memory_maps()` counts the calling process's mappings (None where
/proc is missing). Linux refuses new mappings past `vm.max_map_count` (65,530 by default), which one xdist
worker reached before the release was added.
"""

from __future__ import annotations

import gc
import sys


def memory_maps() -> int | None:
    try:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def release_compiled_programs() -> None:
    jax = sys.modules.get("jax")
    if jax is None:
        return
    gc.collect()
    jax.clear_caches()
    gc.collect()
