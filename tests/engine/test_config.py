"""One `EngineConfig`: its defaults declared once, the same at every entry point, resolved per platform."""

from __future__ import annotations

import dataclasses

import pytest

from jaxchat.engine import config as config_module
from jaxchat.engine.config import MAX_BATCH, MAX_CONTEXT, EngineConfig


class Captured(Exception):
    def __init__(self, config: EngineConfig) -> None:
        super().__init__("captured")
        self.config = config


@pytest.fixture
def capture(monkeypatch):
    """Every entry point's engine stops at `Engine.__init__`, the config it was given resolved for CPU as the engine
    resolves it (no model is loaded: `load_model` gives a placeholder)."""
    import jaxchat.models
    from jaxchat.engine.engine import Engine

    def init(self, model, max_batch=None, max_context=None, *, config=None, mesh=None, warmup=True, start=True,
             **settings):
        raise Captured((config or EngineConfig()).replace(**settings).resolve("cpu"))

    monkeypatch.setattr(jaxchat.models, "load_model", lambda *a, **k: object())
    monkeypatch.setattr(Engine, "__init__", init)

    def run(call) -> EngineConfig:
        with pytest.raises(Captured) as caught:
            call()
        return caught.value.config
    return run


def test_llm_engine_from_path_and_serve_resolve_the_same_config(capture, monkeypatch):
    import jaxchat
    from jaxchat.api import build_chat_service, default_executable_cache
    from jaxchat.cli import _parser, engine_config
    from jaxchat.engine.engine import Engine

    monkeypatch.delenv("JAXCHAT_PROGRAMS", raising=False)  # the users' default, not the test run's
    store = default_executable_cache()
    llm = capture(lambda: jaxchat.LLM())
    from_path = capture(lambda: Engine.from_path(None, executable_cache=store))
    serve_config = engine_config(_parser().parse_args(["serve"]), store)
    serve = capture(lambda: build_chat_service(None, serve_config, constrained=True, start=True, data_parallel=None))
    assert llm == from_path == serve
    assert (llm.max_batch, llm.max_context) == (MAX_BATCH, MAX_CONTEXT)
    assert llm.speculative == "ngram" and llm.programs == "background" and llm.executable_cache == str(store)
    # a setting given at an entry point is the one thing that differs
    assert capture(lambda: jaxchat.LLM(max_batch=2)) == dataclasses.replace(llm, max_batch=2)


def test_serve_flags_become_the_config_and_a_bad_one_is_a_cli_error():
    from jaxchat.cli import _parser, engine_config

    args = _parser().parse_args(["serve", "--max-batch", "3", "--speculative", "off", "--no-overlap",
                                 "--decode-rows", "1,3", "--programs", "all", "--burst-window-ms", "0"])
    got = engine_config(args)
    assert (got.max_batch, got.speculative, got.overlap, got.decode_rows, got.programs, got.burst_gap_s) == (
        3, "off", False, (1, 3), "all", 0.0)
    with pytest.raises(SystemExit, match="max_batch 0"):
        engine_config(_parser().parse_args(["serve", "--max-batch", "0"]))


def test_resolve_fills_each_platform_default_once():
    base = EngineConfig()
    cpu, tpu = base.resolve("cpu"), base.resolve("tpu")
    assert (cpu.speculative, cpu.draft_tokens, cpu.page_size, cpu.max_step_tokens) == (
        "ngram", config_module.DRAFT_TOKENS, 16, 512)
    assert (tpu.speculative, tpu.draft_tokens, tpu.max_step_tokens) == ("off", 0, 2048)
    assert 128 <= tpu.page_size <= 256  # the Pallas kernel's guidance
    assert cpu.resolve("cpu") == cpu and tpu.resolve("tpu") == tpu
    assert EngineConfig(max_batch=2, max_context=64).resolve("gpu").max_step_tokens == 128  # never over the rows' room
    assert base.replace(programs="background").resolve("tpu").programs == "background"  # a cluster's too
    assert base.replace(programs="first").resolve("tpu").programs == "first"


@pytest.mark.parametrize(("changes", "error", "match"), [
    ({"speculative": "eagle"}, ValueError, "speculative 'eagle'"),
    ({"attention": "flash"}, ValueError, "attention 'flash'"),
    ({"programs": "some"}, ValueError, "programs 'some'"),
    ({"max_context": 0}, ValueError, "max_context 0"),
    ({"decode_rows": (1, 16)}, ValueError, "decode_rows"),
    ({"step_token_buckets": ()}, ValueError, "step_token_buckets"),
    ({"draft_tokens": -1}, ValueError, "draft_tokens"),
    ({"max_batchh": 4}, TypeError, "unknown engine setting: max_batchh"),
])
def test_a_bad_setting_names_itself(changes, error, match):
    with pytest.raises(error, match=match):
        EngineConfig().replace(**changes)
