"""The test run's fast-compile switch: tiny models below the threshold get XLA's lowest optimisation level, the
default model's size never does, a bad value is a clear error, and the engine's programs carry the options."""

from __future__ import annotations

import numpy as np
import pytest

from jaxchat.engine import compile_level
from jaxchat.engine.compile_level import FAST_COMPILE_ENV, FAST_COMPILE_OPTIONS, step_compiler_options

DEFAULT_MODEL_PARAMS = 494_032_768  # Qwen2.5-0.5B-Instruct's parameter count (its model card)


class _Shaped:  # a leaf with a shape and no data: counting must not touch the values
    def __init__(self, *shape):
        self.shape = shape


def test_threshold_picks_the_level(monkeypatch):
    tiny = {"embed": np.zeros((1000, 64)), "layers": [np.zeros((64, 64))] * 2, "name": "not an array"}
    monkeypatch.setenv(FAST_COMPILE_ENV, "50000000")
    assert compile_level.param_count(tiny) == 1000 * 64 + 2 * 64 * 64
    assert step_compiler_options(tiny) == FAST_COMPILE_OPTIONS
    assert step_compiler_options({"w": _Shaped(DEFAULT_MODEL_PARAMS)}) == {}
    monkeypatch.setenv(FAST_COMPILE_ENV, "1e3")
    assert step_compiler_options(tiny) == {}
    monkeypatch.delenv(FAST_COMPILE_ENV)
    assert step_compiler_options(tiny) == {}


def test_bad_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(FAST_COMPILE_ENV, "tiny")
    with pytest.raises(ValueError, match=FAST_COMPILE_ENV):
        step_compiler_options({"w": np.zeros(3)})


def test_options_reach_the_compiler(monkeypatch):
    """An option XLA does not know fails the compile: proof that the runner's jit passes its options on."""
    import jax
    import jax.numpy as jnp

    monkeypatch.setattr(compile_level, "FAST_COMPILE_OPTIONS", {"xla_no_such_option_for_jaxchat": 0})
    monkeypatch.setenv(FAST_COMPILE_ENV, "100")
    options = step_compiler_options({"w": np.zeros(3)})
    program = jax.jit(lambda x: x + 1, compiler_options=options)
    with pytest.raises(Exception, match="xla_no_such_option_for_jaxchat"):
        program.lower(jnp.ones(2)).compile()


def test_an_engine_on_a_tiny_model_picks_the_fast_level(monkeypatch):
    """Below the threshold the forwards get the options and the samplers keep XLA's defaults; unset, none do."""
    from jaxchat.engine.engine import Engine
    from tests.engine.helpers import FakeModel, byte_tokenizer

    shapes = {"max_batch": 1, "max_context": 32, "max_step_tokens": 16, "start": False}
    monkeypatch.setenv(FAST_COMPILE_ENV, "50000000")
    engine = Engine(FakeModel(byte_tokenizer()), **shapes)
    try:
        runner = engine.runner
        assert runner.compiler_options == FAST_COMPILE_OPTIONS
        forwards = [k for k in runner.program_keys() if not k.is_sampler]
        samplers = [k for k in runner.program_keys() if k.is_sampler]
        assert forwards and [runner._options_of(k) for k in forwards] == [FAST_COMPILE_OPTIONS] * len(forwards)
        assert samplers and [runner._options_of(k) for k in samplers] == [{}] * len(samplers)
    finally:
        engine.shutdown()
    monkeypatch.delenv(FAST_COMPILE_ENV)
    engine = Engine(FakeModel(byte_tokenizer()), **shapes)
    try:
        assert engine.runner.compiler_options == {}
    finally:
        engine.shutdown()


def test_the_test_runs_fast_compile_list_names_existing_paths_and_reaches_their_engines():
    """tests/conftest.py's FAST_COMPILE_PATHS: every entry names a test file or folder; a module not listed (this
    one) runs without the switch, and a listed module's engines see it (tests/engine/test_engine.py checks its own)."""
    from pathlib import Path

    from tests import conftest

    root = Path(__file__).resolve().parents[2]
    missing = [p for p in conftest.FAST_COMPILE_PATHS if not (root / p).exists()]
    assert not missing, f"FAST_COMPILE_PATHS names paths that do not exist: {missing}"
    assert "tests/engine/test_compile_level.py" not in conftest.FAST_COMPILE_PATHS
    import os

    assert FAST_COMPILE_ENV not in os.environ
    assert conftest.FAST_COMPILE_PARAMS < DEFAULT_MODEL_PARAMS / 5  # the default model (and a 135M one) never


def test_model_tests_paged_rows_compile_tiny_models_fast_and_real_ones_as_users_do():
    from types import SimpleNamespace

    from tests.models import paged

    assert paged.compiler_options(SimpleNamespace(params={"w": np.zeros((64, 64))})) == FAST_COMPILE_OPTIONS
    assert paged.compiler_options(SimpleNamespace(params={"w": _Shaped(DEFAULT_MODEL_PARAMS)})) == {}
