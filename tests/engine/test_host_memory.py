"""`keep_freed_memory`: after it, blocks freed by a worker thread (as XLA:CPU's are) are reused without
new page faults; with glibc's defaults each round of allocations faults its pages in again."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = r"""
import ctypes, resource, sys, threading
from jaxchat.engine.host_memory import keep_freed_memory, release_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size, counts = 10 << 20, {}

def rounds():  # three 10 MB temporaries per round, like one step's buffers
    for i in range(6):
        if i == 1:
            counts["before"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        blocks = [libc.malloc(size) for _ in range(3)]
        for b in blocks:
            ctypes.memset(b, 1, size)
        for b in blocks:
            libc.free(b)
    counts["after"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt

t = threading.Thread(target=rounds)
t.start()
t.join()
release_freed_memory()
print(applied, (counts["after"] - counts["before"]) / 5)
"""


def _faults_per_round(mode: str) -> tuple[str, float]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True, timeout=120)
    applied, faults = out.stdout.split()
    return applied, float(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_freed_blocks_are_reused_without_page_faults():
    applied, kept = _faults_per_round("keep")
    _, default = _faults_per_round("default")
    pages = 3 * (10 << 20) // 4096
    assert applied == "True"
    assert default > pages / 2, default
    assert kept < pages / 50, kept
