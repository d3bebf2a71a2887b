"""glibc malloc settings for a process that runs the engine on the CPU.

XLA:CPU takes each step's temporaries from malloc. With glibc's defaults, blocks of a few MB and up are
mmap'd, and freed memory is given back to the OS (trimmed, per thread arena), so every decode step
page-faults its temporaries in again: ~4,700 minor faults and 5-8 ms per batch-16 sampling pass over
Qwen's 151,936-token vocabulary, about 10% of a batched step.

Contract:
- `keep_freed_memory()` makes malloc keep what it frees for reuse (no mmap'd blocks, no trimming, in every
  arena) and returns True, or False where it does not apply (not glibc). Call it first thing in the
  process, before jax starts its threads. The number of arenas is left as glibc sets it (several): with
  one arena for every thread, XLA's compile threads queued on its lock, and a cold start's first programs
  took 17.7-18.7 s to compile here against 9.3-12.8 s with glibc's arenas (decode also ran 5-15% faster
  with them, for 0.2-0.35 GB more resident memory at the default model).
- `release_freed_memory()` hands memory freed so far back to the OS (`malloc_trim`): call it once after
  loading a model, whose host-side conversion buffers are garbage by then.
- Used by `jaxchat serve` and the benchmarks; a library user opts in. The cost is that the process's
  resident size stays at its peak instead of shrinking after a large temporary is freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys

log = logging.getLogger("jaxchat")

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


def _glibc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # noqa: B018 - raises AttributeError on musl and others
    except (OSError, AttributeError):
        return None
    return libc


def keep_freed_memory() -> bool:
    libc = _glibc()
    if libc is None:
        return False
    ok = all(libc.mallopt(option, value) == 1 for option, value in ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1)))
    if not ok:
        log.warning("malloc settings for the engine were not applied")
    return ok


def release_freed_memory() -> None:
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
