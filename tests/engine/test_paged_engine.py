"""Memory follows tokens: the paged KV pool under a real (tiny, random) Qwen2 in the engine.

- Pages in use rise with the running requests and fall back to none when they end.
- Two conversations with one system prompt hold the same physical pages for it (and only one copy).
- A pool too small for the load preempts the newest requests and finishes every request, each output
  identical to the request run alone (greedy, penalties included).
- A hypothesis test over arrival steps, prompt lengths across page boundaries, shared prefixes and pool sizes
  small enough to preempt: every output equals the same request run alone.
- A request that alone needs more pages than the pool holds ends ("error" for a prompt that can never fit,
  "length" when its output outgrows the pool), and the engine keeps serving.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxchat.engine.engine import Engine
from jaxchat.engine.types import GenerationRequest, SamplingParams
from tests.engine.helpers import tiny_byte_qwen2

PAGE = 4
SHAPES = {"max_batch": 4, "max_context": 128, "page_size": PAGE, "max_step_tokens": 64, "warmup": False,
          "start": False}
SYSTEM = [(7 * i + 3) % 250 for i in range(26)]  # a "system prompt" several requests start with


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_byte_qwen2(tmp_path_factory.mktemp("tiny_qwen2"))


@pytest.fixture(scope="module")
def engines(model):
    """The same programs twice (same pool shape): a small pool with prefix caching (the one under test), and the
    reference, which runs each request alone with nothing cached."""
    tight = Engine(model, **SHAPES, num_pages=40)
    alone = Engine(model, **SHAPES, num_pages=40, prefix_cache=False)
    yield tight, alone
    tight.shutdown()
    alone.shutdown()


def sampling(max_tokens: int, penalty: float = 0.0) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True, frequency_penalty=penalty,
                          presence_penalty=penalty / 2)


def run(engine, requests, on_step=None):
    """requests: (prompt, max_tokens, arrival step, penalty). Steps the scheduler by hand until all are done;
    returns {request index: (output ids, finish reason)}."""
    sched = engine.scheduler
    outs: dict[int, list] = {}
    pending = sorted(enumerate(requests), key=lambda r: r[1][2])
    step = 0
    while pending or engine.core.has_work():
        while pending and pending[0][1][2] <= step:
            i, (prompt, max_tokens, _, penalty) = pending.pop(0)
            outs[i] = []
            sched.submit(GenerationRequest(list(prompt), sampling(max_tokens, penalty), request_id=f"r{i}"),
                         outs[i].append)
        engine.core.step()
        if on_step is not None:
            on_step(sched)
        step += 1
        assert step < 2000
    return {i: ([t for o in got for t in o.token_ids], got[-1].finish_reason) for i, got in outs.items()}


def run_alone(engine, requests):
    return {i: run(engine, [(prompt, n, 0, pen)])[0] for i, (prompt, n, _, pen) in enumerate(requests)}


def test_pages_in_use_rise_and_fall_with_the_requests(engines):
    engine, _ = engines
    used = []
    requests = [(list(range(10, 40)), 12, 0, 0.0), (list(range(50, 61)), 20, 2, 0.0), (list(range(70, 75)), 6, 5, 0.0)]
    outs = run(engine, requests, on_step=lambda s: used.append(s.pool.used()))
    assert all(reason == "length" for _, reason in outs.values())
    one = -(-(30 + 12) // PAGE)  # the first request's pages at its end
    assert max(used) > one  # several requests' pages at once
    assert used[-1] == 0 and engine.stats().kv_pages_used == 0
    assert engine.stats().kv_pages_total == 39


def test_two_conversations_hold_one_copy_of_their_system_prompt(engines):
    engine, reference = engines
    sched = engine.scheduler
    a, b = [*SYSTEM, 1, 2, 3], [*SYSTEM, 9, 8]
    got = {"a": [], "b": []}
    sched.submit(GenerationRequest(a, sampling(8), request_id="a"), got["a"].append)
    engine.core.step()  # a's prompt runs: its full pages are keyed
    sched.submit(GenerationRequest(b, sampling(8), request_id="b"), got["b"].append)
    engine.core.step()
    seq_a, seq_b = (next(s for s in sched.running if s.req.request_id == rid) for rid in ("a", "b"))
    shared = len(SYSTEM) // PAGE
    assert seq_a.pages[:shared] == seq_b.pages[:shared]  # the same physical pages
    assert all(sched.pool.refs[p] == 2 for p in seq_a.pages[:shared])
    assert sched.pool.used() == len(seq_a.pages) + len(seq_b.pages) - shared
    while engine.core.has_work():
        engine.core.step()
    assert got["b"][-1].num_cached_tokens == shared * PAGE and got["a"][-1].num_cached_tokens == 0
    want = run_alone(reference, [(a, 8, 0, 0.0), (b, 8, 0, 0.0)])
    assert [t for o in got["a"] for t in o.token_ids] == want[0][0]
    assert [t for o in got["b"] for t in o.token_ids] == want[1][0]


def test_a_pool_too_small_preempts_and_every_output_is_the_requests_alone(engines):
    engine, reference = engines
    # four prompts with nothing in common (nothing cached to share): 4 x 13 pages > 39
    requests = [([(31 * i + 5 * j + 1) % 256 for j in range(27)], 24, 0, 1.0 if i % 2 else 0.0) for i in range(4)]
    before = engine.stats().preemptions
    outs = run(engine, requests)
    assert engine.stats().preemptions > before
    assert outs == run_alone(reference, requests)
    assert engine.stats().kv_pages_used == 0


prompts = st.one_of(st.lists(st.integers(0, 255), min_size=1, max_size=40),
                    st.lists(st.integers(0, 255), max_size=9).map(lambda tail: SYSTEM[:17] + tail))
requests = st.lists(st.tuples(prompts, st.integers(1, 14), st.integers(0, 6), st.sampled_from([0.0, 0.0, 1.5])),
                    min_size=1, max_size=6)


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests)
def test_any_arrivals_lengths_sharing_and_pressure_give_each_requests_alone_output(engines, reqs):
    engine, reference = engines
    assert run(engine, reqs) == run_alone(reference, reqs)
    assert engine.scheduler.pool.used() == 0 and not engine.scheduler.running


def test_requests_that_outgrow_the_pool_end_and_the_engine_goes_on(model):
    engine = Engine(model, **{**SHAPES, "max_batch": 2}, num_pages=9)  # 8 pages of 4: 32 tokens
    try:
        outs = run(engine, [(list(range(1, 40)), 5, 0, 0.0), (list(range(1, 20)), 40, 0, 0.0),
                            (list(range(1, 6)), 3, 1, 0.0)])
    finally:
        engine.shutdown()
    assert outs[0][1] == "error"  # 39 prompt tokens never fit
    assert outs[1][1] == "length" and 0 < len(outs[1][0]) < 40  # alone, and still out of pages
    assert outs[2] == (outs[2][0], "length") and len(outs[2][0]) == 3
