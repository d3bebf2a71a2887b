"""Bursts: an idle engine woken by a request gathers the rest of a burst (arrivals close together, and requests
the server announced while it reads them) and runs them in one step, instead of its first request alone."""

from __future__ import annotations

import contextvars
import threading
import time

import pytest

from jaxchat.engine.engine import Engine
from jaxchat.engine.types import GenerationRequest, SamplingParams
from tests.engine.helpers import tiny_byte_qwen2

SHAPES = {"max_batch": 4, "max_context": 128, "max_step_tokens": 64, "warmup": False}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_byte_qwen2(tmp_path_factory.mktemp("tiny_qwen2"))


def first_step_rows(engine, submit) -> list[int]:
    """Run `submit(on_output)` against a running engine; the row counts of the steps that admitted requests."""
    admitted: list[int] = []
    launch = engine.runner.launch

    def recording(rows):
        fresh = sum(1 for r in rows if r.fresh)
        if fresh:
            admitted.append(fresh)
        return launch(rows)

    engine.runner.launch = recording
    finished: list[str] = []
    all_done = threading.Event()

    def on_output(out):
        if out.finished:
            finished.append(out.request_id)
            if len(finished) == 3:
                all_done.set()

    try:
        submit(on_output)
        assert all_done.wait(timeout=300)
    finally:
        engine.shutdown()
    return admitted


def request(i: int) -> GenerationRequest:
    return GenerationRequest([5, 6, 7, i], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True),
                             request_id=f"r{i}")


@pytest.mark.serial  # arrivals 20 ms apart must stay within the 200 ms gap: a loaded machine could stretch them
def test_an_idle_engine_gathers_a_burst_into_one_step(model):
    """Three requests submitted 20 ms apart to an idle running engine (a 200 ms gap allowed between arrivals):
    one step admits all three."""
    engine = Engine(model, **SHAPES, burst_gap_s=0.2, burst_window_s=2.0)

    def submit(on_output):
        for i in range(3):
            engine.submit(request(i), on_output)
            time.sleep(0.02)

    assert first_step_rows(engine, submit) == [3]


@pytest.mark.parametrize("announced", [True, False])
def test_an_idle_engine_waits_for_requests_the_server_announced(model, announced):
    """Three requests arrive 150 ms apart, far beyond the 10 ms gap an idle engine waits between arrivals.
    Announced as they come in (`expect_request`, as the server does before reading a body), all three are
    admitted in one step; unannounced, the first one runs alone: the other two are submitted only once its step
    has started, which an engine still gathering (for the 600 s window) would never do."""
    engine = Engine(model, **SHAPES, burst_gap_s=0.01, burst_window_s=600.0)
    contexts = [contextvars.copy_context() for _ in range(3)]
    started = threading.Event()
    launch = engine.runner.launch

    def signalling(rows):
        started.set()
        return launch(rows)

    engine.runner.launch = signalling

    def submit(on_output):
        if announced:
            for ctx in contexts:
                ctx.run(engine.expect_request)
        for i, ctx in enumerate(contexts):
            ctx.run(engine.submit, request(i), on_output)
            if announced:
                time.sleep(0.15)  # a sleep only makes the gaps longer: the announcements hold the burst
            else:
                assert started.wait(timeout=120), "the engine is still gathering a burst nobody announced"

    admitted = first_step_rows(engine, submit)
    if announced:
        assert admitted == [3]
    else:
        assert admitted[0] == 1 and sum(admitted) == 3, admitted


def test_an_announced_request_that_never_comes_does_not_hold_the_burst(model):
    """A request announced and then closed without submitting (a 400) lets the gather end: the waiting request
    is served, where without the close the engine would wait out its 600 s window."""
    engine = Engine(model, **SHAPES, burst_gap_s=0.01, burst_window_s=600.0)
    done = threading.Event()
    try:
        arrival = contextvars.copy_context().run(engine.expect_request)
        engine.submit(GenerationRequest([5, 6, 7], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)),
                      lambda out: out.finished and done.set())
        time.sleep(0.2)
        assert not done.is_set()  # still gathering: the announced request may come
        arrival.close()
        assert done.wait(timeout=120)
    finally:
        engine.shutdown()


def test_an_engine_that_gathers_no_bursts_tracks_no_announcements(model, tmp_path):
    """With bursts off (no gap, or a model whose steps take one row at a time: recurrent layers) there is nothing
    to wait for: `expect_request` is None, which the server accepts, and the engine keeps no record per request."""
    from jaxchat.models import load_model
    from tests.models.conftest import build_tiny

    build_tiny("lfm2", tmp_path)
    for m, kw in ((model, {"burst_gap_s": 0.0}), (load_model(tmp_path, "float32"), {})):
        engine = Engine(m, **{**SHAPES, "start": False}, **kw)
        assert engine.expect_request() is None and engine.arrivals.pending(60) == 0
        engine.shutdown()
