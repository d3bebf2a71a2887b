"""`--dtype auto` (the default): bfloat16 where jax's backend is TPU or GPU, float32 on CPU, logged at load."""

from __future__ import annotations

import logging

import jax
import pytest

from jaxchat.models import ModelLoadError
from jaxchat.models.load import load_model, resolve_dtype

from .conftest import build_tiny


@pytest.mark.parametrize(("backend", "want"), [("tpu", "bfloat16"), ("gpu", "bfloat16"), ("cpu", "float32")])
def test_auto_follows_the_backend(backend, want, monkeypatch):
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    assert resolve_dtype("auto") == want
    assert resolve_dtype("float32") == "float32" and resolve_dtype("bfloat16") == "bfloat16"


def test_unknown_dtype_is_a_clear_error():
    with pytest.raises(ModelLoadError, match="dtype 'float16' is not supported"):
        resolve_dtype("float16")


def test_load_model_defaults_to_auto_and_logs_the_choice(tmp_path, monkeypatch, caplog):
    build_tiny("qwen3", tmp_path)
    with caplog.at_level(logging.INFO, logger="jaxchat.models"):
        lm = load_model(tmp_path)
    assert lm.dtype == "float32" and lm.params["embed"].dtype == jax.numpy.float32  # this machine is a CPU
    assert "dtype float32 (auto)" in caplog.text
    monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
    assert load_model(tmp_path).params["embed"].dtype == jax.numpy.bfloat16
