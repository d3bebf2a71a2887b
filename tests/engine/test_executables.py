"""`ExecutableStore`: a program compiled once is loaded from its file by the next store on the same directory
and computes the same outputs as the jitted function; the key separates identities, argument shapes and
shardings; a damaged file is compiled again and rewritten. (A whole warm `jaxchat serve` start is
tests/e2e/test_warm_start.py.)"""

from __future__ import annotations

import logging
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxchat.engine.executables import ExecutableStore, args_signature, read_program


class State(NamedTuple):
    total: jax.Array
    steps: jax.Array


def _step(state: State, x, scale):
    total = state.total + x * scale
    return State(total, state.steps + 1), {"mean": jnp.mean(total), "max": jnp.max(total)}


PROGRAM = jax.jit(_step, donate_argnums=(0,))


def _args(n: int = 8):
    return State(jnp.arange(n, dtype=jnp.float32), jnp.zeros((), jnp.int32)), np.ones(n, np.float32), np.float32(2.0)


def test_a_second_store_loads_the_program_and_computes_the_same(tmp_path):
    first = ExecutableStore(tmp_path, "model-a")
    compiled = first.load_or_compile("step", PROGRAM, _args())
    assert (first.loaded, first.saved) == (0, 1) and len(list(tmp_path.glob("*.xla"))) == 1
    second = ExecutableStore(tmp_path, "model-a")
    loaded = second.load_or_compile("step", PROGRAM, _args())
    assert (second.loaded, second.saved) == (1, 0)
    expected = PROGRAM(*_args())
    for out in (compiled(*_args()), loaded(*_args())):
        assert jax.tree.structure(out) == jax.tree.structure(expected)
        for got, want in zip(jax.tree.leaves(out), jax.tree.leaves(expected), strict=True):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    state, _ = loaded(*_args())
    state, out = loaded(state, *_args()[1:])  # the loaded program chains on its own (donated) output
    assert int(state.steps) == 2 and float(out["max"]) == 7 + 4


def test_the_key_separates_identity_name_shapes_and_dtypes(tmp_path):
    store = ExecutableStore(tmp_path, "model-a")
    base = store.key("step", _args())
    assert store.key("step", _args()) == base
    assert ExecutableStore(tmp_path, "model-b").key("step", _args()) != base
    assert store.key("other", _args()) != base
    assert store.key("step", _args(16)) != base
    state, x, scale = _args()
    assert store.key("step", (state, x.astype(np.float64), scale)) != base
    assert args_signature(_args()) != args_signature(_args(16))


def test_a_damaged_file_is_compiled_again_and_rewritten(tmp_path, caplog):
    ExecutableStore(tmp_path, "model-a").load_or_compile("step", PROGRAM, _args())
    (path,) = tmp_path.glob("*.xla")
    path.write_bytes(path.read_bytes()[:100])
    store = ExecutableStore(tmp_path, "model-a")
    with caplog.at_level(logging.WARNING):
        compiled = store.load_or_compile("step", PROGRAM, _args())
    assert (store.loaded, store.saved) == (0, 1) and "could not load the compiled program" in caplog.text
    assert path.stat().st_size > 100
    assert float(compiled(*_args())[1]["max"]) == 7 + 2
    again = ExecutableStore(tmp_path, "model-a")
    again.load_or_compile("step", PROGRAM, _args())
    assert again.loaded == 1  # the rewritten file loads


def test_compiles_for_the_store_run_in_parallel_with_jaxs_cache_off_and_restore_it_after_the_last(tmp_path,
                                                                                                monkeypatch):
    """Programs compiled for the store bypass JAX's persistent cache (a program it returns would not serialize
    whole on XLA:CPU). Several compile at once on threads: the cache is off while any of them runs, and back
    on once the last one ends; every program is stored and loads again."""
    import threading

    real_compile = jax.stages.Lowered.compile
    inside, seen, both = [0], [], threading.Barrier(2, timeout=20)

    def watched(self, *a, **k):
        inside[0] += 1
        seen.append(jax.config.jax_enable_compilation_cache)
        both.wait()  # the two compiles overlap: neither waits for the other to finish
        try:
            return real_compile(self, *a, **k)
        finally:
            inside[0] -= 1

    monkeypatch.setattr(jax.stages.Lowered, "compile", watched)
    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", True)
    try:
        store = ExecutableStore(tmp_path, "model-a")
        threads = [threading.Thread(target=store.load_or_compile, args=(name, PROGRAM, _args(n)))
                   for name, n in (("a", 8), ("b", 16))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert seen == [False, False] and inside == [0] and store.saved == 2
        assert jax.config.jax_enable_compilation_cache is True  # restored after the last
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
    monkeypatch.setattr(jax.stages.Lowered, "compile", real_compile)
    again = ExecutableStore(tmp_path, "model-a")
    again.load_or_compile("a", PROGRAM, _args(8))
    again.load_or_compile("b", PROGRAM, _args(16))
    assert again.loaded == 2


def test_a_recorded_program_is_loaded_ahead_and_taken_only_for_its_own_file(tmp_path):
    """`executable_preload`: the files a start recorded are deserialized on a thread; the next store takes the
    preloaded program for that very file (counted in `ahead`), computes the same, and reads any other file
    itself; a record naming a missing file or nothing preloads nothing."""
    from jaxchat.engine import executable_preload

    first = ExecutableStore(tmp_path, "model-a")
    first.load_or_compile("step", PROGRAM, _args())
    first.load_or_compile("step", PROGRAM, _args(16))
    assert len(first.used) == 2 and all((tmp_path / name).exists() for name in first.used)
    key = executable_preload.start_key(str(tmp_path / "model.gguf"), "config", jax.devices())
    assert key != executable_preload.start_key(str(tmp_path / "model.gguf"), "another config", jax.devices())
    executable_preload.record(tmp_path, key, first.used[:1])  # the first program only
    thread = executable_preload.preload(tmp_path, key, read_program)
    thread.join(60)
    second = ExecutableStore(tmp_path, "model-a")
    loaded = second.load_or_compile("step", PROGRAM, _args())
    other = second.load_or_compile("step", PROGRAM, _args(16))
    assert (second.loaded, second.ahead, second.saved) == (2, 1, 0)
    for program, n in ((loaded, 8), (other, 16)):
        got, want = program(*_args(n))[1], PROGRAM(*_args(n))[1]
        assert float(got["max"]) == float(want["max"]) and float(got["mean"]) == float(want["mean"])
    assert executable_preload.take(tmp_path / first.used[0]) is None  # taken once
    executable_preload.record(tmp_path, key, ["missing.xla", "../escape.xla"])
    assert executable_preload.preload(tmp_path, key, read_program) is None
    assert executable_preload.preload(tmp_path, "never-recorded", read_program) is None


def test_a_deferring_store_writes_its_files_only_when_asked_and_the_next_store_loads_them(tmp_path):
    """Inside `deferring()` a compiled program is returned but its file is not written; `save_deferred()` writes
    each kept one once (an engine's background thread does, off the path to the first request)."""
    store = ExecutableStore(tmp_path, "model-a")
    with store.deferring():
        store.load_or_compile("step", PROGRAM, _args())
    assert store.saved == 0 and not list(tmp_path.glob("*.xla"))
    store.save_deferred()
    store.save_deferred()
    assert store.saved == 1 and len(list(tmp_path.glob("*.xla"))) == 1
    again = ExecutableStore(tmp_path, "model-a")
    again.load_or_compile("step", PROGRAM, _args())
    assert (again.loaded, again.saved) == (1, 0)


class _Watched:
    """A jitted program whose lowering and compile are logged in `events`."""

    def __init__(self, program, events: list[str]) -> None:
        self.program, self.events = program, events

    def lower(self, *args):
        self.events.append("lower")
        lowered = self.program.lower(*args)
        events = self.events

        class _Lowered:
            def compile(self):
                events.append("compile")
                return lowered.compile()

        return _Lowered()


def test_on_lowered_runs_between_the_lowering_and_the_compile_and_once_a_program_is_loaded(tmp_path):
    events: list[str] = []
    program = _Watched(PROGRAM, events)
    ExecutableStore(tmp_path, "model-a").load_or_compile("step", program, _args(), lambda: events.append("lowered"))
    assert events == ["lower", "lowered", "compile"]
    events.clear()
    second = ExecutableStore(tmp_path, "model-a")
    second.load_or_compile("step", program, _args(), lambda: events.append("lowered"))
    assert second.loaded == 1 and events == ["lowered"]
