"""`build_chat_service`: the grammar engine is built once the engine's warm-up has lowered (or loaded) its
programs, never beside their tracing; without that signal (no warm-up) it is built all the same, and a failing
warm-up shuts the engine down and raises without waiting on anything."""

from __future__ import annotations

import types

import pytest

from jaxchat.api import build


class _Engine:
    """What `build_chat_service` needs of an engine, logging its calls in `events`."""

    def __init__(self, events: list[str], lowers: bool = True, fails: bool = False) -> None:
        self.events, self.lowers, self.fails = events, lowers, fails
        self.tokenizer = object()
        self.model = types.SimpleNamespace(config=types.SimpleNamespace(vocab_size=32))

    def warm_up(self, lowered=None) -> None:
        self.events.append("tracing")
        if self.fails:
            raise RuntimeError("compile failed")
        if self.lowers:
            lowered()
            lowered()  # a second call builds nothing more
        self.events.append("compiling")

    def start(self) -> None:
        self.events.append("start")

    def shutdown(self) -> None:
        self.events.append("shutdown")


@pytest.fixture()
def events(monkeypatch) -> list[str]:
    log: list[str] = []
    monkeypatch.setattr(build, "_grammar_engine", lambda tokenizer, vocab: log.append(f"grammar {vocab}") or "G")
    monkeypatch.setattr(build, "ChatService", lambda engine, model_id, grammar: (engine, model_id, grammar))
    return log


@pytest.mark.parametrize("lowers", [True, False])
def test_the_grammar_engine_is_built_after_the_programs_are_lowered(events, monkeypatch, lowers):
    engine = _Engine(events, lowers=lowers)
    monkeypatch.setattr("jaxchat.engine.replicas.from_path", lambda *a, **k: engine)
    _, model_id, grammar = build.build_chat_service("/models/m.gguf")
    assert (model_id, grammar) == ("m", "G") and events.count("grammar 32") == 1
    assert events.index("grammar 32") > events.index("tracing") and events[-1] == "start"


def test_unconstrained_builds_no_grammar_engine(events, monkeypatch):
    monkeypatch.setattr("jaxchat.engine.replicas.from_path", lambda *a, **k: _Engine(events))
    assert build.build_chat_service("/models/m.gguf", constrained=False)[2] is None
    assert events == ["tracing", "compiling", "start"]


def test_a_failing_warm_up_shuts_the_engine_down_and_raises(events, monkeypatch):
    monkeypatch.setattr("jaxchat.engine.replicas.from_path", lambda *a, **k: _Engine(events, fails=True))
    with pytest.raises(RuntimeError, match="compile failed"):
        build.build_chat_service("/models/m.gguf")
    assert events == ["tracing", "shutdown"]
