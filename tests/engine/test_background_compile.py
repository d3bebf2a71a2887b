"""Background compiles: the engine serves from its first programs while the others compile on a thread.

A step whose own program is not ready runs as chunks of a ready one with the same greedy tokens; no step waits on
a compile (`compiles_on_request_path` stays 0) while short, long and constrained requests arrive at once right after
start-up; once the background is done every program is ready and steps use them.
"""

from __future__ import annotations

import re
import threading
import time
import types

import pytest

from jaxchat.api.pipeline import ChatPipeline
from jaxchat.engine import engine as engine_module
from jaxchat.engine.engine import Engine, background_order
from jaxchat.engine.program_key import ProgramKey
from jaxchat.engine.types import GenerationRequest, SamplingParams
from jaxchat.server.metrics import Metrics
from tests.engine.helpers import FakeModel, ScriptedConstraint, byte_tokenizer

TOK = byte_tokenizer()
EOS = TOK.convert_tokens_to_ids("<|im_end|>")
SHAPES = dict(max_batch=4, max_context=512, max_step_tokens=256, speculative="ngram")  # buckets 16, 64, 256


def requests():
    """A short, a long (> 2 buckets of the first program) and a constrained request, greedy."""
    long_prompt = "the quick brown fox jumps over the lazy dog " * 8  # ~350 tokens: six chunks of 64
    return [
        GenerationRequest(TOK.encode("hello world"), SamplingParams(max_tokens=12, ignore_eos=True), None, "short"),
        GenerationRequest(TOK.encode(long_prompt), SamplingParams(max_tokens=10, ignore_eos=True), None, "long"),
        GenerationRequest(TOK.encode("pick letters"), SamplingParams(max_tokens=9, ignore_eos=True),
                          ScriptedConstraint(range(97, 123)), "constrained"),
    ]


def run_all(engine: Engine) -> dict[str, list[int]]:
    """Submit every request at once to the running engine; the token ids of each."""
    outs: dict[str, list[int]] = {}
    done = threading.Event()
    lock = threading.Lock()
    reqs = requests()

    def emit(rid):
        def call(out):
            with lock:
                outs.setdefault(rid, []).extend(out.token_ids)
                if out.finished:
                    finished.add(rid)
                    if len(finished) == len(reqs):
                        done.set()
        return call

    finished: set[str] = set()
    for r in reqs:
        engine.submit(r, emit(r.request_id))
    assert done.wait(300), f"requests did not finish: {sorted(finished)}"
    return outs


def launched_keys(engine: Engine) -> list[tuple]:
    """Record the program key of every forward the engine launches from now on."""
    keys: list[tuple] = []
    runner, launch = engine.runner, engine.runner.launch

    def recording(rows):
        key = launch(rows)
        keys.append(key)
        return key

    runner.launch = recording
    return keys


def prometheus(engine: Engine) -> str:
    """/metrics as the server renders it for this engine (the pipeline's stats mapping, then `Metrics`)."""
    pipeline = types.SimpleNamespace(engine=engine)
    service = types.SimpleNamespace(stats=lambda: ChatPipeline.stats(pipeline))
    return Metrics(service).render().decode()


@pytest.fixture(scope="module")
def warm_outputs():
    """What a fully warmed engine (every program compiled before it serves) answers."""
    with Engine(FakeModel(TOK, eos=(EOS,)), programs="all", **SHAPES) as engine:
        assert engine.runner.programs_ready() == len(engine.runner.program_keys())
        return run_all(engine)


def test_requests_right_after_start_up_wait_on_no_compile_and_equal_a_warm_engines(warm_outputs, monkeypatch):
    gate = threading.Event()
    original = engine_module._compile_in_background

    def held(*args):  # the background thread is started at once but compiles nothing until the gate opens
        gate.wait(120)
        original(*args)

    monkeypatch.setattr(engine_module, "_compile_in_background", held)
    with Engine(FakeModel(TOK, eos=(EOS,)), programs="background", **SHAPES) as engine:
        runner = engine.runner
        first = runner.first_keys()
        assert first == [ProgramKey.ragged(64, 4), ProgramKey.decode(4), ProgramKey.sample(4)]
        assert engine.core.background is not None and engine.core.background.is_alive()
        stats = engine.stats()
        assert (stats.programs_ready, stats.programs_total) == (3, len(runner.program_keys()))
        keys = launched_keys(engine)
        early = run_all(engine)
        assert early == warm_outputs
        # the long prompt ran in chunks of the ragged one
        assert set(keys) == {ProgramKey.ragged(64, 4), ProgramKey.decode(4)}
        assert sum(1 for k in keys if k) > 6
        assert engine.stats().compiles_on_request_path == 0
        assert engine.scheduler.speculator.drafted == 0  # no verify program yet: no drafts
        metrics = prometheus(engine)
        assert re.search(r"^jaxchat_compiles_on_request_path_total 0\.0$", metrics, re.M)
        assert re.search(r"^jaxchat_programs_ready 3\.0$", metrics, re.M)
        assert re.search(rf"^jaxchat_programs_total {float(len(runner.program_keys()))}$", metrics, re.M)

        gate.set()
        assert engine.wait_compiled(300)
        stats = engine.stats()
        assert stats.programs_ready == stats.programs_total == len(runner.program_keys())
        keys.clear()
        later = run_all(engine)
        assert later == warm_outputs
        assert {ProgramKey.decode(1), ProgramKey.decode(2)} & set(keys)  # adopted from the background
        assert engine.stats().compiles_on_request_path == 0


def test_a_step_whose_program_is_not_ready_runs_as_chunks_of_a_ready_one():
    """Only the first set compiled (`programs="first"`: no background thread, nothing compiled later): a 350-token
    prompt runs as 64-token chunks, one row's decode steps in the 4-row decode program; the tokens are those of the
    engine that has every program."""
    prompt = TOK.encode("the quick brown fox jumps over the lazy dog " * 8)
    req = GenerationRequest(prompt, SamplingParams(max_tokens=8, ignore_eos=True), None, "r")

    def generate(engine):
        out: list[int] = []
        engine.scheduler.submit(req, lambda o: out.extend(o.token_ids))
        while engine.core.has_work():
            engine.core.step()
        return out

    with Engine(FakeModel(TOK, eos=(EOS,)), start=False, programs="all", **SHAPES) as full:
        keys = launched_keys(full)
        whole = generate(full)
        assert ProgramKey.ragged(256, 4) in keys and ProgramKey.decode(1) in keys
    with Engine(FakeModel(TOK, eos=(EOS,)), start=False, programs="first", **SHAPES) as engine:
        runner = engine.runner
        assert runner.selective and engine.core.background is None
        stats = engine.stats()
        assert stats.programs_ready == len(runner.first_keys()) == 3 < stats.programs_total
        assert runner.max_step_tokens == 64 and runner.max_step_rows == 4 and runner.max_verify_tokens == 0
        keys = launched_keys(engine)
        chunked = generate(engine)
        assert chunked == whole
        assert keys == [ProgramKey.ragged(64, 4)] * -(-len(prompt) // 64) + [ProgramKey.decode(4)] * 7
        assert engine.request_path.compiles == 0
        assert engine.stats().programs_ready == 3  # still the first set: nothing compiled behind the steps


def test_shutting_down_stops_the_background_after_the_compile_in_hand(monkeypatch):
    gate, compiled = threading.Event(), []
    original = engine_module._compile_in_background

    def held(runner, keys, *rest):
        gate.wait(120)
        compile_one = runner.compile
        runner.compile = lambda key: (compiled.append(key), compile_one(key))[1]
        original(runner, keys, *rest)

    monkeypatch.setattr(engine_module, "_compile_in_background", held)
    engine = Engine(FakeModel(TOK, eos=(EOS,)), programs="background", **SHAPES)
    background = engine.core.background
    threading.Timer(1.0, gate.set).start()  # the background starts while the engine shuts down
    engine.shutdown()
    assert not background.is_alive()  # shutdown waited for it
    assert compiled == []  # it saw the runner released and compiled nothing more


@pytest.mark.parametrize("max_batch", [4, 16, 64])
def test_while_programs_are_adopted_one_by_one_every_step_the_scheduler_may_plan_has_a_program(max_batch,
                                                                                              monkeypatch):
    """Two row counts of ragged programs (8 and max_batch) and two verify sizes (16, 64: an accelerator's): after
    each adoption in the background's order, every step within the runner's limits (rows, tokens, and for drafts
    the speculator's rows and tokens) has a ready program. (Adopted as placeholders: nothing runs.)"""
    monkeypatch.setattr(engine_module, "verify_buckets", lambda tokens, platform: (16, 64))
    with Engine(FakeModel(TOK, eos=(EOS,)), max_batch=max_batch, max_context=512, max_step_tokens=2048,
                speculative="ngram", warmup=False, start=False) as engine:
        runner, speculator = engine.runner, engine.scheduler.speculator
        first = runner.first_keys()
        for key in first:
            runner.adopt(key, object())
        runner.selective = True
        order = [k for k in background_order(runner.program_keys()) if k not in first]
        for key in [None, *order]:
            if key is not None:
                runner.adopt(key, object())
            rows, tokens = runner.max_step_rows, runner.max_step_tokens
            assert rows >= 1 and tokens >= rows
            for n in range(1, rows + 1):
                for t in sorted({n, n + 1, tokens // 2, tokens} - {0}):
                    if n <= t <= tokens:
                        assert runner.shape_for(n, t) is not None, (key, n, t)
            speculator.limit = runner.max_verify_tokens
            if speculator.limit > 1:
                for n in range(1, min(speculator.max_rows, rows) + 1):
                    assert runner.shape_for(n, speculator.limit, verify=True) is not None, (key, n)
        assert runner.max_step_tokens == 2048 and runner.max_verify_tokens == 64


def test_the_background_goes_sampler_then_forward_so_each_is_usable_at_once():
    decode, ragged, verify, sample = ProgramKey.decode, ProgramKey.ragged, ProgramKey.verify, ProgramKey.sample
    keys = [decode(1), decode(4), ragged(16, 4), verify(8, 4), sample(1), sample(4), sample(8)]
    assert background_order(keys) == [sample(1), decode(1), sample(4), decode(4), ragged(16, 4), sample(8),
                                      verify(8, 4)]


def test_an_unknown_program_set_is_a_clear_error():
    with pytest.raises(ValueError, match="programs 'some': choose one of background, all, first"):
        Engine(FakeModel(TOK, eos=(EOS,)), programs="some", **SHAPES)


def test_background_compiles_run_workers_at_once_in_order_and_count_in_the_engines_tally(monkeypatch):
    """With `workers` > 1 the background takes the keys in their order, several compile at once on their own
    threads, each is adopted as it is ready, and every compile counts in the engine's tally (the threads inherit
    nothing: each counts itself in)."""
    import time

    import jax.numpy as jnp

    from jaxchat.engine.compiles import Tally

    keys = [ProgramKey.sample(r) for r in (1, 2, 4, 8)]
    started, adopted, running, peak, lock = [], [], [0], [0], threading.Lock()

    class Runner:
        released = False
        executables = None

        def compile(self, key):
            with lock:
                started.append(key)
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.2)
            jnp.zeros(key.rows + 7919).block_until_ready()  # one real compile each (a new shape)
            with lock:
                running[0] -= 1
            return threading.current_thread().name

        def adopt(self, key, compiled):
            adopted.append((key, compiled))

        def programs_ready(self):
            return len(adopted)

        def program_keys(self):
            return keys

    tally, seconds = Tally(), {}
    monkeypatch.setattr(engine_module, "BACKGROUND_START_QUIET_S", 0.0)  # no start-up grace: the order shows
    engine_module._compile_in_background(Runner(), keys, tally, seconds, workers=2)
    assert started == keys and sorted(k for k, _ in adopted) == sorted(keys) and set(seconds) == set(keys)
    assert peak[0] == 2 and len({thread for _, thread in adopted}) == 2
    assert tally.compiles >= len(keys)
    assert engine_module.background_workers() >= 1 and engine_module.compile_workers(3) >= 1


def test_in_a_cluster_the_background_waits_to_be_linked_and_adopts_once_every_process_has_a_program(monkeypatch):
    """In a cluster the warm-up leaves the rest to `compile_rest`, called once linked: on process 0 each program is
    adopted only when `before_adopt` (every follower has it) says so, and a follower reports each it adopts; the
    same programs end up ready on both, and nothing is adopted while the gate is shut."""
    monkeypatch.setattr(engine_module, "in_cluster", lambda: True)  # the warm-up sees a cluster
    leader = Engine(FakeModel(TOK, eos=(EOS,)), programs="background", start=False, **SHAPES)
    follower = Engine(FakeModel(TOK, eos=(EOS,)), programs="background", start=False, **SHAPES)
    monkeypatch.undo()
    try:
        first = set(leader.runner.first_keys())
        assert leader.core.background is None and leader.runner.programs_ready() == len(first)  # not started yet
        reported, gate = [], threading.Event()
        follower.compile_rest(after_adopt=reported.append)
        assert follower.wait_compiled(300)
        rest = [k for k in background_order(follower.runner.program_keys()) if k not in first]
        assert reported == rest and follower.runner.programs_ready() == len(follower.runner.program_keys())

        leader.compile_rest(before_adopt=lambda key: gate.wait(300) and key in reported)
        time.sleep(1.0)
        assert leader.runner.programs_ready() == len(first)  # compiled, held back: the followers' answer is due
        gate.set()
        assert leader.wait_compiled(300)
        assert leader.runner.programs_ready() == len(leader.runner.program_keys())
    finally:
        leader.shutdown()
        follower.shutdown()


def test_the_first_background_compile_waits_for_a_quiet_engine_and_the_others_only_for_an_idle_one(monkeypatch):
    """A server's first request comes right after it opens: the background's first compile starts only once the
    engine has been idle for `BACKGROUND_START_QUIET_S` (here 0.4 s, after 0.5 s busy), the next ones as soon as
    it is idle. The first set's store files, kept back by the warm-up, are written then, before that compile."""
    from jaxchat.engine.compiles import Tally

    monkeypatch.setattr(engine_module, "BACKGROUND_START_QUIET_S", 0.4)
    keys = [ProgramKey.sample(r) for r in (1, 2, 4)]
    started, adopted, saved = [], [], []

    class Store:
        def save_deferred(self):
            saved.append(time.monotonic())

    class Runner:
        released = False
        executables = Store()

        def compile(self, key):
            started.append(time.monotonic())
            return key

        def adopt(self, key, compiled):
            adopted.append(key)

        def programs_ready(self):
            return len(adopted)

        def program_keys(self):
            return keys

    t0 = time.monotonic()
    busy_until = t0 + 0.5
    engine_module._compile_in_background(Runner(), keys, Tally(), {}, busy=lambda: time.monotonic() < busy_until)
    assert adopted == keys
    assert started[0] - t0 >= 0.5 + 0.4 - 0.06  # busy, then quiet for the whole period
    assert len(saved) == 1 and saved[0] - t0 >= 0.5 + 0.4 - 0.06 and saved[0] <= started[0]
    assert started[-1] - started[0] < 0.3  # the others wait for nothing: the engine is idle


def test_the_warm_ups_lowered_callback_runs_once_after_every_first_program_is_lowered():
    """`Engine.warm_up(lowered=...)` (what the grammar engine's build waits for): called once, from whichever
    compile thread lowered the last of the first set, and not before."""
    with Engine(FakeModel(TOK, eos=(EOS,)), warmup=False, start=False, programs="first", **SHAPES) as engine:
        runner, events, lock = engine.runner, [], threading.Lock()
        compile_one = runner.compile

        def watched(key, on_lowered=None):
            def lowered():
                with lock:
                    events.append(("lowered", key))
                on_lowered()
            return compile_one(key, on_lowered=lowered)

        runner.compile = watched
        engine.warm_up(lowered=lambda: events.append(("all lowered", None)))
        first = runner.first_keys()
        assert len(first) == 3 and [e for e, _ in events].count("all lowered") == 1
        assert events[-1] == ("all lowered", None) and {k for _, k in events[:-1]} == set(first)
        assert runner.programs_ready() == 3
