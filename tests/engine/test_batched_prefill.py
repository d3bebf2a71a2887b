"""Batched prefills: arrivals admitted in the same step are prefilled together in one program.

- Greedy outputs (penalties included, so the rows' counts and prompt masks matter) are identical with batched
  prefills and with each prompt prefilled alone, over bursts of arrivals, shared prefixes (prefix reuse on),
  arrivals while other rows decode, and output lengths (hypothesis).
- A burst takes one batched program; padding rows of a program that starts below the arrivals' rows (running
  rows) are left as they were.
- `StepRunner.swap` (prefix reuse swaps rows on admission and compaction) trades exactly two rows.
- A step's first tokens are handed out after its prefills, before its decode (`Scheduler.after_prefills`); a
  request submitted while a step's prefills run is admitted before that step's decode; an idle engine woken
  by a request waits for the rest of a burst and prefills it in one program."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxchat.engine.engine import Engine
from jaxchat.engine.types import GenerationRequest, SamplingParams
from tests.engine.helpers import count_calls, tiny_byte_qwen2

SHARED = list(range(40, 52))  # a prefix several prompts start with: rows that held it are reused


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return tiny_byte_qwen2(tmp_path_factory.mktemp("tiny_qwen2"))


@pytest.fixture(scope="module")
def engines(model):
    """A tiny Qwen2 twice: batched prefills of up to 2 and 4 prompts, and every prompt prefilled alone."""
    shapes = {"max_batch": 4, "max_context": 128, "length_buckets": (8, 16, 32, 128), "warmup": False,
              "start": False, "prefill_chunk": 0}
    batched = Engine(model, **shapes, prefill_batches=(2, 4))
    alone = Engine(model, **shapes, prefill_batches=())
    assert batched.runner.prefill_batches == (2, 4) and alone.runner.prefill_batches == ()
    yield batched, alone
    batched.shutdown()
    alone.shutdown()


def run_schedule(engine, requests):
    """requests: (prompt, max_tokens, step it arrives at, penalty). Steps the scheduler by hand until all are
    done; returns {request id: output ids}."""
    sched = engine.scheduler
    outs: dict[str, list[int]] = {}
    pending = sorted(enumerate(requests), key=lambda r: r[1][2])
    step = 0
    while pending or sched.has_work():
        while pending and pending[0][1][2] <= step:
            i, (prompt, max_tokens, _, penalty) = pending.pop(0)
            sampling = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True,
                                      frequency_penalty=penalty, presence_penalty=penalty / 2)
            sched.submit(GenerationRequest(list(prompt), sampling, request_id=f"r{i}"),
                         lambda out, rid=f"r{i}": outs.setdefault(rid, []).extend(out.token_ids))
        sched.step()
        step += 1
        assert step < 500
    return outs


prompt = st.one_of(st.lists(st.integers(0, 255), min_size=1, max_size=40),
                   st.lists(st.integers(0, 255), max_size=6).map(lambda tail: SHARED + tail))
request = st.tuples(prompt, st.integers(1, 8), st.sampled_from([0, 0, 0, 3, 9]), st.sampled_from([0.0, 1.5]))


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(request, min_size=2, max_size=7))
def test_greedy_outputs_equal_prefilling_each_prompt_alone(engines, requests):
    batched, alone = engines
    want = run_schedule(alone, requests)
    got = run_schedule(batched, requests)
    assert got == want
    assert all(len(got[f"r{i}"]) == r[1] for i, r in enumerate(requests))


def test_a_burst_of_arrivals_takes_one_batched_program(engines):
    batched, alone = engines
    requests = [(list(range(10 + i, 30 + i)), 4, 0, 0.0) for i in range(4)]
    calls, restore = count_calls(batched.runner, ("prefill", "prefill_rows"))
    try:
        got = run_schedule(batched, requests)
    finally:
        restore()
    assert calls == {"prefill": 0, "prefill_rows": 1}
    assert got == run_schedule(alone, requests)


def test_padding_rows_below_the_arrivals_keep_the_running_rows(engines):
    """One row decodes when three prompts arrive: they take rows 1-3, so the 4-row program starts at row 0,
    whose running row is padding there (no K/V written, counts kept: its penalties see them)."""
    batched, alone = engines
    runner = batched.runner
    requests = [([1, 2, 3, 4, 5], 12, 0, 1.5), ([60, 61, 62], 5, 3, 1.5), ([70, 71], 5, 3, 1.5),
                ([80, 81, 82, 83], 5, 3, 1.5)]
    keys = []
    rows_call = runner._rows_call

    def recording(slot, rows, *args):
        call = rows_call(slot, rows, *args)
        keys.append((slot, len(rows), call[0], int(call[2][2])))  # the program's first row
        return call

    runner._rows_call = recording
    try:
        got = run_schedule(batched, requests)
    finally:
        del runner._rows_call
    assert keys == [(1, 3, ("prefill_rows", 4, 8), 0)]
    assert got == run_schedule(alone, requests)


def test_swap_exchanges_two_rows_and_keeps_the_others(engines):
    """`StepRunner.swap` (a row read out, a move, the row written back): the two rows' cache, counts and prompt
    masks trade places; every other row is untouched."""
    import jax

    from jaxchat.engine.prefix_cache import ResidentPrefixes
    from jaxchat.engine.sampler import SamplingArrays

    _, alone = engines
    r = alone.runner
    mask = np.full((1, r.mask_words), -1, np.int32)
    for row in range(4):
        r.prefill(row, [row + 1] * (5 + row), mask, SamplingArrays.numpy(1))
    alone.scheduler.prefixes = ResidentPrefixes(r.max_batch)  # the rows no longer hold what the records say
    axes = batch_axes(r)
    before = [np.asarray(x) for x in jax.tree.leaves(r.state)]
    r.swap(1, 3)
    after = [np.asarray(x) for x in jax.tree.leaves(r.state)]
    assert any(not np.array_equal(np.take(x, 1, axis=a), np.take(x, 3, axis=a)) for x, a in zip(before, axes))
    for x, y, axis in zip(before, after, axes, strict=True):
        np.testing.assert_array_equal(np.take(y, [0, 3, 2, 1], axis=axis), x)


def test_a_swap_below_an_extent_trades_only_the_chunks_that_hold_it(engines):
    """`swap(a, b, extent)` trades the cache chunks below the smallest span bucket >= extent (and the counts and
    prompt masks, whole); the chunks above it keep what they held. `move` likewise copies only those."""
    from jaxchat.engine.prefix_cache import ResidentPrefixes
    from jaxchat.engine.sampler import SamplingArrays

    _, alone = engines
    r = alone.runner
    assert len(r.move_extents) > 1 and r.move_extents[-1] == r.max_context
    mask = np.full((1, r.mask_words), -1, np.int32)
    for row in range(4):  # each row written over the whole context, so every chunk differs between rows
        r.prefill(row, [row + 1] * (r.max_context - 1), mask, SamplingArrays.numpy(1))
    alone.scheduler.prefixes = ResidentPrefixes(r.max_batch)  # as above: the records no longer match the rows

    def chunks(state):
        return [[np.asarray(c) for c in layer] for cache in (state.cache_k, state.cache_v) for layer in cache]

    axis = r._cache_axis
    for kept, extent in enumerate(r.move_extents[:-1], start=1):
        before, counts = chunks(r.state), np.asarray(r.state.counts)
        r.swap(1, 3, extent=extent - 1)
        after = chunks(r.state)
        np.testing.assert_array_equal(np.asarray(r.state.counts), counts[[0, 3, 2, 1]])
        for layer_before, layer_after in zip(before, after, strict=True):
            for i, (x, y) in enumerate(zip(layer_before, layer_after, strict=True)):
                order = [0, 3, 2, 1] if i < kept else [0, 1, 2, 3]
                np.testing.assert_array_equal(np.take(y, order, axis=axis), x)
        r.move(2, 0, extent=extent)
        moved = chunks(r.state)
        for layer_after, layer_moved in zip(after, moved, strict=True):
            for i, (x, y) in enumerate(zip(layer_after, layer_moved, strict=True)):
                np.testing.assert_array_equal(np.take(y, 0, axis=axis), np.take(x, 2 if i < kept else 0, axis=axis))


def batch_axes(runner) -> list[int]:
    """The batch axis of each leaf of the runner's DecodeState: the cache's, then 0 for counts and prompt masks."""
    import jax

    state = runner.state
    n_cache = len(jax.tree.leaves((state.cache_k, state.cache_v)))
    return [runner._cache_axis] * n_cache + [0, 0]


def test_first_tokens_are_handed_out_before_the_steps_decode(engines):
    """r0 arrives at step 0, r1 at step 3 while r0 decodes: when each step's prefills are done, the arrival's
    first token is out and that step's decode has not run yet."""
    batched, _ = engines
    sched = batched.scheduler
    outs: dict[str, list[int]] = {"r0": [], "r1": []}
    calls, restore = count_calls(batched.runner, ("decode",))
    seen = []
    sched.after_prefills = lambda: seen.append((len(outs["r0"]), len(outs["r1"]), calls["decode"]))
    try:
        for step in range(12):
            if step in (0, 3):
                rid = f"r{step // 3}"
                sched.submit(GenerationRequest([5, 6, 7, step], SamplingParams(max_tokens=6, temperature=0,
                                                                               ignore_eos=True), request_id=rid),
                             lambda out, rid=rid: outs[rid].extend(out.token_ids))
            sched.step()
    finally:
        sched.after_prefills = None
        restore()
    assert not sched.has_work() and len(outs["r0"]) == len(outs["r1"]) == 6
    # r0: its prefill's token, then one per decode of steps 0-2; r1: its prefill's token; decodes so far: 3
    assert seen == [(1, 0, 0), (4, 1, 3)]


@pytest.fixture(scope="module")
def mixed(model):
    """Batched prefills and mixed steps of 8 prompt tokens."""
    engine = Engine(model, max_batch=4, max_context=128, length_buckets=(8, 16, 32, 128), warmup=False,
                    start=False, prefill_chunk=8, prefill_batches=(2, 4))
    assert engine.runner.prefill_chunk == 8
    yield engine
    engine.shutdown()


@pytest.mark.parametrize("mixed_steps", [False, True])
def test_a_request_arriving_during_a_steps_prefill_is_admitted_before_its_decode(engines, mixed, mixed_steps):
    """r1 is submitted while r0's prefill runs (a burst whose first request woke the engine): the same step
    prefills it too, hands both first tokens out, then runs one decode over both rows. With mixed steps on
    too: r0 was not running when the step began, so r1 does not wait for a mixed step."""
    batched = mixed if mixed_steps else engines[0]
    sched, runner = batched.scheduler, batched.runner
    outs: dict[str, list[int]] = {"r0": [], "r1": []}

    def submit(rid, last):
        sched.submit(GenerationRequest([5, 6, 7, last], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True),
                                       request_id=rid), lambda out: outs[rid].extend(out.token_ids))

    prefill = runner.prefill

    def prefill_while_r1_arrives(*args, **kwargs):
        out = prefill(*args, **kwargs)
        if "r1" not in seen_submit:
            seen_submit.append("r1")
            submit("r1", 9)
        return out

    seen_submit: list[str] = []
    runner.prefill = prefill_while_r1_arrives
    calls, restore = count_calls(runner, ("decode",))
    handed = []
    sched.after_prefills = lambda: handed.append((len(outs["r0"]), len(outs["r1"]), calls["decode"]))
    try:
        submit("r0", 8)
        sched.step()
        assert handed == [(1, 0, 0), (1, 1, 0)]  # r0's first token out, then r1's, both before the decode
        assert calls["decode"] == 1 and len(outs["r0"]) == len(outs["r1"]) == 2
        while sched.has_work():
            sched.step()
    finally:
        sched.after_prefills = None
        restore()
        del runner.prefill
    assert len(outs["r0"]) == len(outs["r1"]) == 4


def test_an_idle_engine_gathers_a_burst_into_one_batched_prefill(model):
    """Three requests submitted 20 ms apart to an idle running engine (a 200 ms gap allowed between arrivals):
    one batched prefill takes all three, none is prefilled alone."""
    import threading
    import time

    engine = Engine(model, max_batch=4, max_context=128, length_buckets=(8, 16, 32, 128), warmup=False,
                    prefill_chunk=0, prefill_batches=(4,), burst_gap_s=0.2, burst_window_s=2.0)
    calls, restore = count_calls(engine.runner, ("prefill", "prefill_rows"))
    finished: list[str] = []
    all_done = threading.Event()

    def on_output(out):
        if out.finished:
            finished.append(out.request_id)
            if len(finished) == 3:
                all_done.set()

    try:
        for i in range(3):
            engine.submit(GenerationRequest([5, 6, 7, i], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True),
                                            request_id=f"r{i}"), on_output)
            time.sleep(0.02)
        assert all_done.wait(timeout=120)
    finally:
        engine.shutdown()
        restore()
    assert calls == {"prefill": 0, "prefill_rows": 1}


@pytest.mark.parametrize("announced", [True, False])
def test_an_idle_engine_waits_for_requests_the_server_announced(model, announced):
    """Three requests arrive 150 ms apart, far beyond the 10 ms gap an idle engine waits between arrivals.
    Announced as they come in (`expect_request`, as the server does before reading a body), all three are
    prefilled in one batched program; unannounced, the first one is prefilled alone (by the single-row program)."""
    import contextvars
    import threading
    import time

    engine = Engine(model, max_batch=4, max_context=128, length_buckets=(8, 16, 32, 128), warmup=False,
                    prefill_chunk=0, prefill_batches=(4,), burst_gap_s=0.01, burst_window_s=30.0)
    calls, restore = count_calls(engine.runner, ("prefill", "prefill_rows"))
    finished: list[str] = []
    all_done = threading.Event()

    def on_output(out):
        if out.finished:
            finished.append(out.request_id)
            if len(finished) == 3:
                all_done.set()

    contexts = [contextvars.copy_context() for _ in range(3)]
    try:
        if announced:
            for ctx in contexts:
                ctx.run(engine.expect_request)
        for i, ctx in enumerate(contexts):
            ctx.run(engine.submit, GenerationRequest(
                [5, 6, 7, i], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), request_id=f"r{i}"),
                on_output)
            time.sleep(0.15)
        assert all_done.wait(timeout=120)
    finally:
        engine.shutdown()
        restore()
    if announced:
        assert calls == {"prefill": 0, "prefill_rows": 1}
    else:  # the later two may or may not share a program, depending on how long the first one took
        assert calls["prefill"] >= 1 and calls["prefill"] + calls["prefill_rows"] >= 2, calls


def test_an_announced_request_that_never_comes_does_not_hold_the_burst(model):
    """A request announced and then closed without submitting (a 400) lets the gather end: the waiting request
    is served long before the 30 s window."""
    import contextvars
    import threading
    import time

    engine = Engine(model, max_batch=4, max_context=128, length_buckets=(8, 16, 32, 128), warmup=False,
                    prefill_chunk=0, prefill_batches=(4,), burst_gap_s=0.01, burst_window_s=30.0)
    done = threading.Event()
    try:
        arrival = contextvars.copy_context().run(engine.expect_request)
        t0 = time.monotonic()
        engine.submit(GenerationRequest([5, 6, 7], SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)),
                      lambda out: out.finished and done.set())
        time.sleep(0.2)
        assert not done.is_set()  # still gathering: the announced request may come
        arrival.close()
        assert done.wait(timeout=20)
        assert time.monotonic() - t0 < 25
    finally:
        engine.shutdown()


def test_an_engine_that_gathers_no_bursts_tracks_no_announcements(model):
    """With bursts off (no gap, or no batched prefill) there is nothing to wait for: `expect_request` is None,
    which the server accepts, and the engine keeps no record per request."""
    for kw in ({"burst_gap_s": 0.0}, {"prefill_batches": ()}):
        engine = Engine(model, max_batch=2, max_context=64, length_buckets=(8, 64), warmup=False, start=False, **kw)
        assert engine.expect_request() is None and engine.arrivals.pending(60) == 0
        engine.shutdown()
