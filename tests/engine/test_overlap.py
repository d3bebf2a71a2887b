"""The overlapped host loop: step N+1's forward is launched before step N's tokens are read, and greedy outputs
are token for token those of the loop that launches, samples and takes in turn, whatever the arrivals,
constraints (masks, forced text with and without jump-forward), stop strings, penalties and lengths. Also what
travels: no mask when no row is constrained, logprob arrays only when a request asks, one forward program per
step when every row jumps forward. And the point of it: with the forward on a device of its own, the host's
mask fill no longer adds to the step's time."""

from __future__ import annotations

import statistics
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.host_overhead import DeviceClock
from jaxchat.engine.engine import Engine
from jaxchat.engine.types import GenerationRequest, SamplingParams
from tests.engine.helpers import FakeModel, ScriptedConstraint, byte_tokenizer
from tests.engine.test_jump_forward import ForcingConstraint

TOK = byte_tokenizer()
EOS = TOK.convert_tokens_to_ids("<|im_end|>")


@pytest.fixture(scope="module")
def engines():
    shapes = {"max_batch": 4, "max_context": 96, "max_step_tokens": 64, "start": False, "prefix_cache": True}
    overlapped = Engine(FakeModel(TOK, eos=(EOS,)), **shapes)
    in_turn = Engine(FakeModel(TOK, eos=(EOS,)), **shapes, overlap=False)
    assert overlapped.core.overlap and not in_turn.core.overlap
    yield overlapped, in_turn
    overlapped.shutdown()
    in_turn.shutdown()


def constraint_of(kind, spec):
    if kind == "forcing":
        return ForcingConstraint(*spec)
    if kind == "scripted":
        return ScriptedConstraint(spec[0], length=spec[1])
    return None


def run(engine, requests):
    """Submit each request at its step, run to the end; per request (token ids, text, finish reason)."""
    sched = engine.scheduler
    got = {i: [] for i in range(len(requests))}
    arrivals = sorted(range(len(requests)), key=lambda i: requests[i][0])
    step = 0
    while arrivals or engine.core.has_work():
        while arrivals and requests[arrivals[0]][0] <= step:
            i = arrivals.pop(0)
            _, prompt, sampling, kind, spec = requests[i]
            sched.submit(GenerationRequest(TOK.encode(prompt), sampling, constraint_of(kind, spec), str(i)),
                         got[i].append)
        engine.core.step()
        step += 1
    out = {}
    for i, outs in got.items():
        assert outs[-1].finished and outs[-1].finish_reason in ("length", "stop"), outs[-1]
        out[i] = ([t for o in outs for t in o.token_ids], "".join(o.text for o in outs), outs[-1].finish_reason)
    return out


constraints = st.one_of(
    st.tuples(st.just(None), st.just(None)),
    st.tuples(st.just("forcing"), st.tuples(st.dictionaries(st.integers(0, 20), st.text("xyz", min_size=2, max_size=9),
                                                            max_size=2), st.integers(3, 30))),
    st.tuples(st.just("scripted"), st.tuples(st.lists(st.integers(32, 126), min_size=1, max_size=6),
                                             st.integers(2, 30))),
)
request = st.tuples(
    st.integers(0, 6),  # arrival step
    st.sampled_from(["hello there", "a b c", "zzz", "x" * 40, "the quick brown fox " * 3]),
    st.builds(SamplingParams, max_tokens=st.integers(1, 30), ignore_eos=st.booleans(),
              repetition_penalty=st.sampled_from([1.0, 1.3]), frequency_penalty=st.sampled_from([0.0, 0.5]),
              presence_penalty=st.sampled_from([0.0, 0.4]), stop=st.sampled_from([(), ("e",), ("zz",)])),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(st.tuples(request, constraints).map(lambda rc: (*rc[0], *rc[1])), min_size=1, max_size=6))
def test_greedy_outputs_identical_overlapped_and_in_turn(engines, requests):
    overlapped, in_turn = engines
    assert run(overlapped, requests) == run(in_turn, requests)


def test_the_next_forward_is_launched_before_the_tokens_are_read(engines):
    """In steady decode each step launches its forward, then reads the previous step's tokens, then samples."""
    overlapped, _ = engines
    runner, calls = overlapped.runner, []
    originals = {name: getattr(runner, name) for name in ("launch", "sample", "fetch")}
    for name, call in originals.items():
        setattr(runner, name, lambda *a, _n=name, _c=call, **k: (calls.append(_n), _c(*a, **k))[1])
    try:
        run(overlapped, [(0, "hello there", SamplingParams(max_tokens=8, ignore_eos=True), None, None),
                         (0, "zzz", SamplingParams(max_tokens=8, ignore_eos=True), None, None)])
    finally:
        for name in originals:
            delattr(runner, name)
    text = " ".join(calls)
    assert text.startswith("launch sample launch fetch sample launch fetch sample")
    assert text.count("fetch") == text.count("sample")


def test_no_mask_travels_when_no_row_is_constrained(engines):
    overlapped, _ = engines
    runner = overlapped.runner
    before = runner.mask_transfers
    run(overlapped, [(0, "hello there", SamplingParams(max_tokens=6), None, None),
                     (1, "zzz", SamplingParams(max_tokens=6, temperature=0.8, seed=3), None, None)])
    assert runner.mask_transfers == before
    run(overlapped, [(0, "hello there", SamplingParams(max_tokens=6), "scripted", ([104, 105], 6))])
    assert runner.mask_transfers > before


def test_logprob_arrays_travel_only_when_asked(engines):
    overlapped, _ = engines
    runner, asked = overlapped.runner, []
    fetch = runner.fetch
    runner.fetch = lambda logprobs=False: (asked.append(logprobs), fetch(logprobs))[1]
    try:
        run(overlapped, [(0, "hello there", SamplingParams(max_tokens=5), None, None)])
        assert asked and not any(asked)
        got = run(overlapped, [(0, "hello there", SamplingParams(max_tokens=5, logprobs=2), None, None)])
        assert any(asked) and len(got[0][0]) == 5
    finally:
        del runner.fetch


def test_sixteen_rows_jumping_forward_run_one_forward_program_a_step():
    """Every row jumps forward (forced spans at several points): each step still runs exactly one forward
    program, the forced tokens riding as extra query tokens of their rows."""
    engine = Engine(FakeModel(TOK, eos=(EOS,)), max_batch=16, max_context=96, step_token_buckets=(64,),
                    decode_rows=(16,), start=False, warmup=False)
    try:
        runner, forwards = engine.runner, []
        forward = runner._forward
        runner._forward = lambda key, args: (forwards.append(key), forward(key, args))[1]
        sched = engine.scheduler
        got = {i: [] for i in range(16)}
        for i in range(16):
            spans = {0: "xyzxy", 4 + i % 3: "zyxzyx", 14: "xxyyzz"}
            sched.submit(GenerationRequest(TOK.encode("hello there"), SamplingParams(max_tokens=24),
                                           ForcingConstraint(spans, 24), str(i)), got[i].append)
        steps = 0
        while engine.core.has_work():
            before = len(forwards)
            engine.core.step()
            assert len(forwards) - before <= 1
            steps += 1
        assert sched.forced_tokens >= 16 * 12 and len(forwards) <= steps
        assert all(outs[-1].finished and outs[-1].num_generated_tokens == 24 for outs in got.values())
    finally:
        engine.shutdown()


class SlowFill(ScriptedConstraint):
    """A constraint whose mask fill takes `seconds` of host time (a sleep: the cores stay free)."""

    def __init__(self, allowed, seconds: float):
        super().__init__(allowed)
        self.seconds = seconds

    def fill_mask(self, row):
        time.sleep(self.seconds)
        super().fill_mask(row)


def step_periods(engine, constraint, steps: int) -> list[float]:
    sched, done = engine.scheduler, []
    sched.submit(GenerationRequest(TOK.encode("hello there"), SamplingParams(max_tokens=steps, ignore_eos=True),
                                   constraint, "slow"), lambda out: done.append(out) if out.finished else None)
    periods = []
    while engine.core.has_work():
        t0 = time.perf_counter()
        engine.core.step()
        periods.append(time.perf_counter() - t0)
    assert done and done[0].finish_reason == "length"
    return periods


def test_the_overlapped_loop_hides_the_mask_fill_behind_the_forward(engines):
    """With the forward on an emulated device of its own (bench/host_overhead.py's `DeviceClock`: 60 ms a
    forward) and a mask fill of 30 ms a step, a step of the in-turn loop takes the forward and the fill one
    after the other (about 90 ms); the overlapped loop fills while the next forward runs (about 60 ms)."""
    device, fill = 0.060, 0.030
    medians = {}
    for engine in engines:
        with DeviceClock(engine.runner, 1000 * device):
            periods = step_periods(engine, SlowFill(range(97, 123), fill), steps=12)
        medians[engine.core.overlap] = statistics.median(periods[3:-2])
    assert medians[False] > device + 0.8 * fill, medians
    assert medians[True] < device + 0.4 * fill, medians
