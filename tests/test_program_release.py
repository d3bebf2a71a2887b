"""The release tests/conftest.py runs after each test file frees what compiled programs map: without it one
xdist worker hit Linux's per-process mapping limit (tests/program_release.py)."""

from __future__ import annotations

import pytest

from tests.program_release import memory_maps, release_compiled_programs

PROGRAMS = 80


def _program(x):
    import jax.numpy as jnp

    return jnp.tanh(x @ x.T).sum(0)


def _compile_and_drop(n: int) -> int:
    """Compile and run n programs (a long-lived function at n shapes, as the engines jit theirs), keep no
    reference to them: JAX's caches still hold each executable. The mappings then."""
    import jax
    import jax.numpy as jnp

    for i in range(n):
        jax.jit(_program)(jnp.ones((1 + i, 8))).block_until_ready()
    return memory_maps()


@pytest.mark.skipif(memory_maps() is None, reason="no /proc/self/maps on this system")
def test_release_frees_the_mappings_of_dropped_programs():
    import jax

    jax.jit(lambda x: x + 1)(1).block_until_ready()  # JAX's CPU client maps its own code once: not measured
    release_compiled_programs()
    before = memory_maps()
    grown = _compile_and_drop(PROGRAMS)
    assert grown - before >= PROGRAMS  # each live executable maps its code: the growth the release must undo
    release_compiled_programs()
    after = memory_maps()
    assert after - before <= (grown - before) // 4, (before, grown, after)


def test_release_without_jax_is_a_no_op(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "jax", raising=False)
    release_compiled_programs()  # must not import JAX
    assert "jax" not in sys.modules
