"""The scheduler's decisions, run by the real engine core over a fake runner (`fake_runner`): no JAX, no device.

Each test plans steps for requests whose tokens the toy model decides from every token the row's pages hold, so a
request's tokens equal what it gets alone only when admission, chunking, pages, sharing, preemption and drafts
were all planned right.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxchat.engine.core import EngineCore
from jaxchat.engine.mailbox import Mailbox
from jaxchat.engine.scheduler import Scheduler
from jaxchat.engine.types import GenerationOutput, GenerationRequest, SamplingParams
from tests.engine.fake_runner import FakeRunner, alone

ROOT = Path(__file__).resolve().parents[2]


class Outputs:
    """What each request got: its tokens, its finish reason, its cached prompt tokens."""

    def __init__(self) -> None:
        self.tokens: dict[str, list[int]] = {}
        self.finish: dict[str, list[str]] = {}
        self.cached: dict[str, int] = {}

    def emit_for(self, rid: str):
        self.tokens[rid], self.finish[rid] = [], []

        def emit(out: GenerationOutput) -> None:
            self.tokens[rid] += out.token_ids
            self.cached[rid] = out.num_cached_tokens
            if out.finished:
                self.finish[rid].append(out.finish_reason)
        return emit


def build(runner: FakeRunner, *, overlap: bool = False, draft_tokens: int = 0, prefix_cache: bool = True,
          eos: tuple[int, ...] = ()) -> tuple[Scheduler, EngineCore, Outputs]:
    sched = Scheduler(runner.shape, None, eos, prefix_cache=prefix_cache, draft_tokens=draft_tokens)
    return sched, EngineCore(sched, runner, Mailbox(), overlap=overlap), Outputs()


def submit(sched: Scheduler, outputs: Outputs, rid: str, prompt: list[int], max_tokens: int, **sampling) -> None:
    sched.submit(GenerationRequest(list(prompt), SamplingParams(max_tokens=max_tokens, **sampling), request_id=rid),
                 outputs.emit_for(rid))


def drain(core: EngineCore, check=None, limit: int = 5000) -> int:
    """Step until nothing is left; how many steps it took (a bound on them: no request may starve)."""
    steps = 0
    while core.has_work():
        core.step()
        steps += 1
        if check is not None:
            check(core.scheduler)
        assert steps < limit, "the scheduler made no progress"
    return steps


def pages_shared_rightly(sched: Scheduler) -> None:
    """A page two running requests hold is at the same place in both tables, over the same tokens."""
    ps = sched.pool.page_size
    holders: dict[int, tuple] = {}
    for seq in sched.running:
        if seq.slot < 0:
            continue
        for i, page in enumerate(seq.pages):
            tokens = tuple(seq.tokens[i * ps:(i + 1) * ps])
            if page in holders:
                assert holders[page] == (i, tokens), f"page {page} held by two requests for different tokens"
                assert len(tokens) == ps, f"page {page} shared before it is full"
            holders[page] = (i, tokens)


def test_the_scheduler_and_the_core_import_no_jax_and_run_a_step_without_it():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'jax' or name.startswith(('jax.', 'jaxlib')):\n"
        "            raise ImportError('JAX is blocked: ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from tests.engine.test_scheduler import build, drain, submit, FakeRunner, alone\n"
        "runner = FakeRunner(2, 64, 16, 4, 8)\n"
        "sched, core, out = build(runner, overlap=True)\n"
        "submit(sched, out, 'a', [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 6)\n"
        "drain(core)\n"
        "assert out.tokens['a'] == alone([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 6), out.tokens\n"
        "print('no jax:', not any(m == 'jax' or m.startswith('jax.') for m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no jax: True"


def test_continuous_batching_admits_in_order_within_the_slots_and_every_request_gets_its_own_tokens():
    runner = FakeRunner(max_batch=3, max_context=128, num_pages=64, page_size=4, max_step_tokens=16)
    sched, core, out = build(runner)
    prompts = {f"r{i}": [(7 * i + j) % 50 + 1 for j in range(3 + 2 * i)] for i in range(6)}
    for rid, prompt in prompts.items():
        submit(sched, out, rid, prompt, 5 + len(prompt) % 4)
    core.step()
    assert [seq.req.request_id for seq in sched.running] == ["r0", "r1", "r2"]  # three slots, arrival order
    assert len(sched.waiting) == 3
    drain(core, pages_shared_rightly)
    for rid, prompt in prompts.items():
        assert out.tokens[rid] == alone(prompt, 5 + len(prompt) % 4), rid
        assert out.finish[rid] == ["length"]
    assert sched.pool.used() == 0 and sorted(sched.free_slots) == [0, 1, 2]


def test_a_long_prompt_is_prefilled_in_chunks_of_the_step_budget_beside_decoding_rows():
    runner = FakeRunner(max_batch=2, max_context=128, num_pages=64, page_size=4, max_step_tokens=16)
    sched, core, out = build(runner)
    short, long = [3, 1, 4, 1, 5], [(j * 11) % 60 + 1 for j in range(70)]
    submit(sched, out, "short", short, 12)
    core.step()
    submit(sched, out, "long", long, 4)
    drain(core)
    assert out.tokens["short"] == alone(short, 12) and out.tokens["long"] == alone(long, 4)
    chunked = [tokens for rows, tokens, _ in runner.steps if rows == 2]
    assert len(chunked) >= 4 and max(chunked) == 16  # the prompt ran 15 tokens a step beside the decoding row


def test_under_pool_pressure_the_newest_request_is_preempted_and_recomputed_to_the_same_tokens():
    # 13 usable pages of 4 tokens: three requests that grow to 40 tokens each cannot all stay
    runner = FakeRunner(max_batch=3, max_context=64, num_pages=14, page_size=4, max_step_tokens=32)
    sched, core, out = build(runner, prefix_cache=False)
    prompts = {rid: [(k * 5 + j) % 40 + 1 for j in range(10)] for k, rid in enumerate("abc")}
    for rid, prompt in prompts.items():
        submit(sched, out, rid, prompt, 30)
    drain(core, pages_shared_rightly)
    assert sched.preemptions > 0
    for rid, prompt in prompts.items():
        assert out.tokens[rid] == alone(prompt, 30), rid
    assert sched.pool.used() == 0


def test_a_request_too_long_for_the_pool_alone_ends_with_length_and_one_whose_prompt_never_fits_with_error():
    runner = FakeRunner(max_batch=2, max_context=256, num_pages=6, page_size=4, max_step_tokens=32)
    sched, core, out = build(runner)
    submit(sched, out, "grows", [1, 2, 3, 4, 5, 6], 40)
    submit(sched, out, "huge", list(range(1, 30)), 2)
    drain(core)
    assert out.finish["grows"] == ["length"] and out.tokens["grows"] == alone([1, 2, 3, 4, 5, 6], 40)[:len(
        out.tokens["grows"])] and len(out.tokens["grows"]) < 40
    assert out.finish["huge"] == ["error"] and out.tokens["huge"] == []


def test_a_shared_prefix_is_mapped_from_the_cache_and_the_tokens_stay_those_of_the_request_alone():
    runner = FakeRunner(max_batch=2, max_context=128, num_pages=64, page_size=4, max_step_tokens=64)
    sched, core, out = build(runner)
    system = [(j * 13) % 60 + 1 for j in range(24)]
    submit(sched, out, "first", system + [5, 6], 6)
    drain(core)
    submit(sched, out, "second", system + [7, 8, 9], 6)
    drain(core)
    assert out.cached["first"] == 0 and out.cached["second"] == 24  # six full pages of the shared system prompt
    assert sched.prefix_hit_tokens == 24
    assert out.tokens["second"] == alone(system + [7, 8, 9], 6)
    _, core_off, out_off = build(FakeRunner(2, 128, 64, 4, 64), prefix_cache=False)
    submit(core_off.scheduler, out_off, "first", system + [5, 6], 6)
    submit(core_off.scheduler, out_off, "second", system + [7, 8, 9], 6)
    drain(core_off)
    assert out_off.cached == {"first": 0, "second": 0}


def test_speculative_drafts_are_planned_verified_and_change_no_token():
    prompt = [2, 7, 1, 8, 2] * 5
    on = FakeRunner(max_batch=2, max_context=128, num_pages=64, page_size=4, max_step_tokens=32, max_verify_tokens=16)
    sched, core, out = build(on, draft_tokens=4)
    submit(sched, out, "copy", prompt, 24)
    steps_on = drain(core)
    off = FakeRunner(max_batch=2, max_context=128, num_pages=64, page_size=4, max_step_tokens=32)
    sched_off, core_off, out_off = build(off)
    submit(sched_off, out_off, "copy", prompt, 24)
    steps_off = drain(core_off)
    assert out.tokens["copy"] == out_off.tokens["copy"] == alone(prompt, 24)
    assert any(verify for _, _, verify in on.steps) and sched.speculator.accepted > 0
    assert sched.speculator.drafted > sched.speculator.accepted  # the toy model rejects some drafts too
    assert steps_on < steps_off


def test_a_stop_token_ends_a_request_and_an_abort_frees_its_slot_and_pages_at_the_next_step():
    stops = [3, 1, 4, 1, 5, 9]
    eos = alone(stops, 8)[3]  # the model's 4th token for this prompt is its stop token
    runner = FakeRunner(max_batch=2, max_context=128, num_pages=64, page_size=4, max_step_tokens=32)
    sched, core, out = build(runner, overlap=True, eos=(eos,))
    submit(sched, out, "stops", stops, 8)
    submit(sched, out, "aborted", [2, 7, 1, 8, 2, 8], 100)
    for _ in range(3):
        core.step()
    sched.abort("aborted")
    drain(core)
    assert out.finish["stops"] == ["stop"] and out.tokens["stops"] == alone(stops, 8, eos)
    assert out.tokens["stops"][-1] == eos and len(out.tokens["stops"]) <= 4
    assert out.finish["aborted"] == ["abort"] and 0 < len(out.tokens["aborted"]) < 100
    assert out.tokens["aborted"] == alone([2, 7, 1, 8, 2, 8], 100)[:len(out.tokens["aborted"])]
    assert sched.pool.used() == 0 and sorted(sched.free_slots) == [0, 1]


def test_rows_beyond_the_step_row_limit_wait_their_turn_and_all_finish():
    runner = FakeRunner(max_batch=6, max_context=128, num_pages=128, page_size=4, max_step_tokens=64, max_step_rows=2)
    sched, core, out = build(runner, overlap=True)
    prompts = {f"r{i}": [i + 1, i + 2, i + 3] for i in range(6)}
    for rid, prompt in prompts.items():
        submit(sched, out, rid, prompt, 10)
    drain(core)
    assert max(rows for rows, _, _ in runner.steps) == 2
    assert all(out.tokens[rid] == alone(p, 10) and out.finish[rid] == ["length"] for rid, p in prompts.items())


arrival = st.tuples(
    st.integers(0, 12),  # the step it arrives before
    st.lists(st.integers(1, 6), min_size=1, max_size=30),  # its prompt's own tokens
    st.booleans(),  # whether its prompt starts with the shared prefix
    st.integers(1, 14),  # max_tokens
    st.one_of(st.none(), st.integers(0, 20)),  # the step it is aborted before (None: never)
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=st.lists(arrival, min_size=1, max_size=7), overlap=st.booleans(), prefix_cache=st.booleans(),
       pages=st.integers(12, 40), budget=st.sampled_from([8, 16, 64]), drafts=st.booleans(), slots=st.integers(1, 6))
def test_random_arrivals_aborts_and_pool_pressure_keep_the_invariants(arrivals, overlap, prefix_cache, pages, budget,
                                                                       drafts, slots):
    """Invariants: no page held for two different contents, every request finishes exactly once, one not aborted
    gets exactly its tokens alone (or, only when the pool cannot hold it, a prefix of them with "length"), and
    at the end no page is in use and every slot is free."""
    runner = FakeRunner(max_batch=slots, max_context=64, num_pages=pages, page_size=4, max_step_tokens=budget,
                        max_verify_tokens=16 if drafts else 0)
    sched, core, out = build(runner, overlap=overlap, prefix_cache=prefix_cache, draft_tokens=4 if drafts else 0)
    shared = [5, 4, 3, 2, 1, 6, 5, 4]
    prompts, aborted = {}, set()
    for step in range(25):
        for i, (at, own, with_prefix, max_tokens, abort_at) in enumerate(arrivals):
            rid = f"r{i}"
            if at == step:
                prompts[rid] = ((shared if with_prefix else []) + own)[:40], max_tokens
                submit(sched, out, rid, *prompts[rid])
            if abort_at == step and rid in prompts and not out.finish[rid]:
                sched.abort(rid)
                aborted.add(rid)
        if core.has_work():
            core.step()
            pages_shared_rightly(sched)
    drain(core, pages_shared_rightly)
    assert set(out.finish) == set(prompts)
    for rid, (prompt, max_tokens) in prompts.items():
        assert len(out.finish[rid]) == 1, f"{rid} finished {out.finish[rid]}"
        want = alone(prompt, max_tokens)
        if rid in aborted and out.finish[rid] == ["abort"]:
            assert out.tokens[rid] == want[:len(out.tokens[rid])]
        elif out.finish[rid] == ["length"] and len(out.tokens[rid]) < max_tokens:
            assert runner.num_pages - 1 < sched.pool.pages_for(len(prompt) + max_tokens)  # the pool cannot hold it
            assert out.tokens[rid] == want[:len(out.tokens[rid])]
        else:
            assert out.tokens[rid] == want, rid
            assert out.finish[rid] == ["length"]
    assert sched.pool.used() == 0 and sorted(sched.free_slots) == list(range(slots)) and not sched.running
