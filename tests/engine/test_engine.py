"""Engine and scheduler on a tiny fake model: no recompiles, batch isolation, stops, abort, errors."""

from __future__ import annotations

import asyncio

import jax
import numpy as np
import pytest

from jaxchat.engine.compiles import compile_count, compiled_names
from jaxchat.engine.engine import Engine
from jaxchat.engine.types import GenerationRequest, SamplingParams
from tests.engine.helpers import FakeModel, ScriptedConstraint, byte_tokenizer

TOK = byte_tokenizer()
EOS = TOK.convert_tokens_to_ids("<|im_end|>")


@pytest.fixture(scope="module")
def engine():
    e = Engine(FakeModel(TOK, eos=(EOS,)), max_batch=4, max_context=64, start=False)
    yield e
    e.shutdown()


def test_this_files_tiny_engines_compile_with_the_fast_options(engine):
    """tests/conftest.py lists this file in FAST_COMPILE_PATHS: its module fixtures' engines see the switch."""
    import os

    from jaxchat.engine.compile_level import FAST_COMPILE_ENV, FAST_COMPILE_OPTIONS
    from tests.conftest import FAST_COMPILE_PARAMS

    assert os.environ.get(FAST_COMPILE_ENV) == str(FAST_COMPILE_PARAMS)
    assert engine.runner.compiler_options == FAST_COMPILE_OPTIONS


def run_sync(engine, plan):
    """Drive the scheduler by hand. plan: {step_index: [("submit", req) | ("abort", id)]}; returns outputs."""
    outs: dict[str, list] = {}
    sched = engine.scheduler
    step = 0
    while step in plan or engine.core.has_work() or any(k > step for k in plan):
        for action, arg in plan.get(step, []):
            if action == "submit":
                outs[arg.request_id] = []
                sched.submit(arg, outs[arg.request_id].append)
            else:
                sched.abort(arg)
        engine.core.step()
        step += 1
    assert not sched.running
    return outs


def ids_of(outs):
    return [t for o in outs for t in o.token_ids]


def req(rid, prompt="hello world", **kw):
    kw.setdefault("ignore_eos", True)
    constraint = kw.pop("constraint", None)
    return GenerationRequest(TOK.encode(prompt), SamplingParams(**kw), constraint, rid)


def test_batch_isolation_with_joins_leaves_and_aborts(engine):
    alone = run_sync(engine, {0: [("submit", req("p", max_tokens=24))]})["p"]
    assert alone[-1].finish_reason == "length" and len(ids_of(alone)) == 24
    plan = {
        0: [("submit", req("a", "héllo", max_tokens=5)), ("submit", req("b", "x" * 40, max_tokens=30))],
        1: [("submit", req("p", max_tokens=24))],
        3: [("submit", req("c", "abc", max_tokens=40, temperature=0.9, top_p=0.8, seed=1))],
        6: [("abort", "b"), ("submit", req("d", "zz", max_tokens=3, constraint=ScriptedConstraint(range(97, 123))))],
        9: [("submit", req("e", "q", max_tokens=4, presence_penalty=1.0, logprobs=3))],
    }
    outs = run_sync(engine, plan)
    assert ids_of(outs["p"]) == ids_of(alone)
    assert "".join(o.text for o in outs["p"]) == "".join(o.text for o in alone)
    assert outs["b"][-1].finish_reason == "abort"
    assert all(97 <= t < 123 for t in ids_of(outs["d"]))
    assert [len(o.logprobs[0].top) for o in outs["e"]] == [3] * 4


def test_no_recompiles_after_warmup(engine):
    run_sync(engine, {0: [("submit", req("warm", max_tokens=2))]})
    before = compile_count()
    rng = np.random.default_rng(0)
    plan = {}
    for i in range(14):
        kw = {"max_tokens": int(rng.integers(1, 12)), "temperature": float(rng.choice([0, 0.7, 1.3])),
                  "top_k": int(rng.choice([0, 5])), "top_p": float(rng.choice([1.0, 0.9])),
                  "min_p": float(rng.choice([0, 0.1])), "repetition_penalty": float(rng.choice([1.0, 1.2])),
                  "frequency_penalty": float(rng.choice([0, 0.5])), "logprobs": [None, 0, 5][i % 3], "seed": i}
        if i % 3 == 1:
            kw["constraint"] = ScriptedConstraint(rng.choice(256, size=20, replace=False))
        prompt = "".join(rng.choice(list("abcdefgh é")) for _ in range(int(rng.integers(1, 60))))
        plan.setdefault(int(rng.integers(0, 12)), []).append(("submit", req(f"r{i}", prompt, **kw)))
    outs = run_sync(engine, plan)
    assert all(o[-1].finish_reason in ("length", "stop") for o in outs.values()), outs
    assert compile_count() == before, compiled_names(before)


def test_stop_conditions(engine):
    eos_id = EOS
    c = ScriptedConstraint([eos_id, *range(97, 100)], length=1000)
    outs = run_sync(engine, {0: [
        ("submit", req("tok", max_tokens=50, stop_token_ids=(int(ids_of(run_sync(engine, {0: [
            ("submit", req("probe", max_tokens=3))]})["probe"])[2]),))),
        ("submit", req("eos", max_tokens=50, ignore_eos=False, constraint=ScriptedConstraint([eos_id]))),
        ("submit", req("term", max_tokens=50, constraint=ScriptedConstraint(range(97, 100), length=4))),
        ("submit", req("ctx", "y" * 60, max_tokens=50)),
        ("submit", req("long", "y" * 64, max_tokens=5)),
        ("submit", req("empty", "", max_tokens=5)),
        ("submit", req("mixed", max_tokens=6, ignore_eos=False, constraint=c)),
    ]})
    assert outs["tok"][-1].finish_reason == "stop" and len(ids_of(outs["tok"])) == 3
    assert outs["eos"][-1].finish_reason == "stop" and outs["eos"][-1].stop_reason == eos_id
    assert "".join(o.text for o in outs["eos"]) == ""  # the stop token's text is not emitted
    assert outs["term"][-1].finish_reason == "stop" and len(ids_of(outs["term"])) == 4
    assert outs["ctx"][-1].finish_reason == "length" and len(ids_of(outs["ctx"])) == 64 - 60 + 1
    assert outs["long"][-1].finish_reason == "error" and "prompt_ids" in outs["long"][-1].error
    assert outs["empty"][-1].finish_reason == "error"
    assert outs["mixed"][-1].finish_reason in ("stop", "length")


def test_stop_strings_cut_the_text(engine):
    def ascii_req(rid, **kw):
        return req(rid, max_tokens=12, constraint=ScriptedConstraint(range(97, 123)), **kw)

    text = "".join(o.text for o in run_sync(engine, {0: [("submit", ascii_req("f"))]})["f"])
    stop = text[3:5]
    assert len(stop) == 2
    cut = run_sync(engine, {0: [("submit", ascii_req("s", stop=(stop,)))]})["s"]
    assert cut[-1].finish_reason == "stop" and cut[-1].stop_reason == stop
    assert "".join(o.text for o in cut) == text[: text.find(stop)]


def test_constraint_exception_ends_only_that_request(engine):
    alone = run_sync(engine, {0: [("submit", req("ok", max_tokens=10))]})["ok"]
    outs = run_sync(engine, {0: [
        ("submit", req("bad", max_tokens=10, constraint=ScriptedConstraint(range(97, 123), raise_at=3))),
        ("submit", req("ok", max_tokens=10)),
    ]})
    assert outs["bad"][-1].finish_reason == "error" and "scripted constraint failure" in outs["bad"][-1].error
    assert len(ids_of(outs["bad"])) == 3
    assert ids_of(outs["ok"]) == ids_of(alone) and outs["ok"][-1].finish_reason == "length"


def test_abort_frees_the_slot(engine):
    sched = engine.scheduler
    got = []
    sched.submit(req("long", max_tokens=1000), got.append)
    engine.core.step()
    engine.core.step()
    assert len(sched.running) == 1 and engine.stats().free_slots == 3
    sched.abort("long")
    engine.core.step()
    assert not sched.running and got[-1].finish_reason == "abort"
    assert engine.stats().running == 0


def test_async_generate_and_early_exit(engine):
    engine.start()

    async def main():
        async def collect(r):
            return [o async for o in engine.generate(r)]

        results = await asyncio.gather(*(collect(req(f"g{i}", "ab" * (i + 1), max_tokens=5 + i)) for i in range(6)))
        for i, outs in enumerate(results):
            assert outs[-1].finished and outs[-1].num_generated_tokens == 5 + i
        agen = engine.generate(req("early", max_tokens=1000))
        async for _ in agen:
            break
        await agen.aclose()
        for _ in range(200):
            if engine.stats().running == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.stats().running == 0

    asyncio.run(main())
    assert engine.stats().compiles_on_request_path == 0


def test_warmup_runs_the_small_programs_once_and_leaves_no_trace():
    """Warm-up also runs each program of at most PRIME_TOKENS tokens once (XLA:CPU's first run of a program is
    slower than the next ones) and leaves the counts and prompt masks zero: greedy outputs, penalties
    included, equal those of an engine whose warm-up only compiled."""
    from jaxchat.engine.step import PRIME_TOKENS

    shapes = {"max_batch": 4, "max_context": 128, "start": False, "warmup": False}
    primed, plain = Engine(FakeModel(TOK, eos=(EOS,)), **shapes), Engine(FakeModel(TOK, eos=(EOS,)), **shapes)
    runner, ran = primed.runner, []
    forward = runner._forward
    runner._forward = lambda key, args: (ran.append(key), forward(key, args))[1]
    try:
        runner.warmup(prime=True)
    finally:
        del runner._forward
    plain.runner.warmup(prime=False)
    decodes = {key for key in runner._compiled if key.kind == "decode"}
    ragged = {key for key in runner._compiled if key.kind == "ragged"}
    assert decodes and decodes <= set(ran)
    assert {key for key in ragged if key.tokens <= PRIME_TOKENS} == {key for key in ran if key.kind == "ragged"}
    assert any(key[1] > PRIME_TOKENS for key in ragged)  # a long bucket is compiled but not run
    assert not np.asarray(runner.state.counts).any() and not np.asarray(runner.state.prompt_mask).any()
    assert not any(np.asarray(x).any() for x in jax.tree.leaves(runner.state.pools))  # nothing was written
    plan = {0: [("submit", req("a", max_tokens=9, temperature=0, repetition_penalty=1.5)),
                ("submit", req("b", "hello there", max_tokens=7, temperature=0, frequency_penalty=1.0))],
            2: [("submit", req("c", "hi", max_tokens=5, temperature=0, presence_penalty=1.0))]}
    got, want = run_sync(primed, plan), run_sync(plain, plan)
    assert {k: ids_of(v) for k, v in got.items()} == {k: ids_of(v) for k, v in want.items()}
    primed.shutdown()
    plain.shutdown()
