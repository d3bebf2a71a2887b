"""Prefix reuse: multi-turn conversations give the same greedy outputs with and without it, under any turn
order and slot pressure; reuse is counted, reported as usage.prompt_tokens_details.cached_tokens and on
/metrics, and off for models with recurrent layers."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxchat.engine.engine import Engine
from jaxchat.engine.prefix_cache import Placement, ResidentPrefixes
from jaxchat.engine.types import GenerationRequest, SamplingParams
from tests.engine.helpers import FakeModel, byte_tokenizer, count_calls

TOK = byte_tokenizer()
EOS = TOK.convert_tokens_to_ids("<|im_end|>")


def test_plan_reuses_the_longest_prefix_and_overwrites_the_least_valuable_row():
    p = ResidentPrefixes(4)
    p.record(1, [5, 5, 9])
    p.record(2, [1, 2, 3, 4, 5, 6])
    p.record(3, [7])
    # the prompt continues most of row 2's record (the same conversation): it takes row 2 itself; the match is
    # capped at len - 1 (the last prompt token is always run)
    assert p.plan([1, 2, 3, 4, 5], range(4)) == Placement(2, 2, 4)
    # a short match (a shared template head): row 2 keeps its record, the empty row 0 is taken and the
    # prefix copied from row 2
    assert p.plan([1, 2, 8, 8, 8, 8, 8, 8], range(4)) == Placement(0, 2, 2)
    # nothing shared and no empty row: the least recently recorded or used row (row 1; row 2 was just used)
    assert p.plan([8, 1], [1, 2, 3]) == Placement(1, -1, 0)
    p.swapped(1, 3)
    assert p.held(3) == (5, 5, 9) and p.held(1) == (7,)
    p.forget(2)
    assert p.plan([5, 5, 9, 9, 9], [1, 2, 3]) == Placement(3, 3, 3)
    assert p.plan([5, 1], [3]) == Placement(3, 3, 1)  # the only idle row: taken even for a short match


def test_rows_recorded_in_one_step_are_equally_old_and_a_repeated_prompt_takes_them_in_place():
    p = ResidentPrefixes(4)
    p.tick()
    for row in range(4):  # a burst of one prompt, finished together: the prompt and an 8-token reply each
        p.record(row, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    p.tick()
    # the prompt again (a short match: not the same conversation): each request takes the row it is placed in
    for slot in range(4):
        assert p.plan([1, 2, 3, 12], range(slot, 4)) == Placement(slot, slot, 3)
        p.forget(slot)
    # of equally old rows, the one the request is placed in is taken even when another holds the prefix:
    # a copy, no swap
    q = ResidentPrefixes(2)
    q.tick()
    q.record(0, [7, 7, 7, 7, 7, 7, 7, 7])
    q.record(1, [1, 2, 3, 4, 5, 6, 7, 8])
    q.tick()
    assert q.plan([1, 2, 3, 12], range(2)) == Placement(0, 1, 3)
    # rows of different steps: the least recently used one is taken (LRU, as before)
    r = ResidentPrefixes(3)
    for row in (2, 0, 1):
        r.tick()
        r.record(row, [1, 2, 3, 4, 5, 6, 7, 8])
    r.tick()
    assert r.plan([1, 2, 3, 12], range(3)) == Placement(2, 2, 3)
    assert r.plan([9, 9], range(2)) == Placement(0, -1, 0)


@pytest.fixture(scope="module")
def engines():
    """The same tiny model twice: prefix reuse on and off; 2 slots, so 3 conversations compete for rows."""
    shapes = {"max_batch": 2, "max_context": 128, "length_buckets": (32, 128), "start": False}
    on = Engine(FakeModel(TOK, eos=(EOS,)), **shapes)
    off = Engine(FakeModel(TOK, eos=(EOS,)), **shapes, prefix_cache=False)
    assert on.runner.keep_prefixes and not off.runner.keep_prefixes
    yield on, off
    on.shutdown()
    off.shutdown()


def run_rounds(engine, rounds, user_turns, max_tokens, stop_ids=()):
    """Conversations grow turn by turn: a turn's prompt is the previous prompt, its reply and the next user
    text. `rounds`: per round, which conversations take their next turn (submitted together, in that order,
    one step apart). Returns {(conversation, turn): (reply ids, cached tokens)}."""
    sched = engine.scheduler
    history = {c: TOK.encode(turns[0]) for c, turns in user_turns.items()}
    taken = dict.fromkeys(user_turns, 0)
    out = {}
    for members in rounds:
        members = [c for c in members if taken[c] < len(user_turns[c])]
        got = {c: [] for c in members}
        for c in members:
            if taken[c]:
                history[c] = history[c] + TOK.encode(user_turns[c][taken[c]])
            s = SamplingParams(max_tokens=max_tokens[c], ignore_eos=True, repetition_penalty=1.3 if c % 2 else 1.0,
                               stop_token_ids=stop_ids)
            sched.submit(GenerationRequest(list(history[c]), s, None, f"{c}.{taken[c]}"), got[c].append)
            sched.step()
        while sched.has_work():
            sched.step()
        for c in members:
            reply = [t for o in got[c] for t in o.token_ids]
            assert got[c][-1].finish_reason in ("length", "stop")
            out[(c, taken[c])] = (reply, got[c][-1].num_cached_tokens)
            history[c] = history[c] + reply
            taken[c] += 1
    return out


conversation_rounds = st.lists(st.permutations([0, 1, 2]).flatmap(
    lambda order: st.integers(1, 3).map(lambda k: order[:k])), min_size=3, max_size=7)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=conversation_rounds, lengths=st.lists(st.integers(1, 9), min_size=3, max_size=3),
       stop_ids=st.sets(st.integers(0, 319), max_size=40))
def test_greedy_outputs_identical_with_and_without_reuse(engines, rounds, lengths, stop_ids):
    on, off = engines
    user_turns = {c: [f"system {c} " * 3 + "hello", f" and then {c}?", " more"] for c in range(3)}
    max_tokens = dict(enumerate(lengths))
    hits_before = on.scheduler.prefix_hit_tokens
    stop_ids = tuple(sorted(stop_ids))  # some turns end on a stop token (not written back), some on length
    with_reuse = run_rounds(on, rounds, user_turns, max_tokens, stop_ids)
    without = run_rounds(off, rounds, user_turns, max_tokens, stop_ids)
    assert {k: v[0] for k, v in with_reuse.items()} == {k: v[0] for k, v in without.items()}
    assert all(cached == 0 for _, cached in without.values())
    cached = sum(c for _, c in with_reuse.values())
    assert on.scheduler.prefix_hit_tokens - hits_before == cached
    if any(turn > 0 for _, turn in with_reuse) and len({c for r in rounds for c in r}) == 1:
        assert cached > 0  # one conversation alone always finds its own row again


def test_recurrent_models_never_reuse(tmp_path):
    """LFM2 keeps a convolution window per row: its state at position n depends on the tokens after n, so
    the runner turns reuse off whatever the engine asks."""
    from jaxchat.models import load_model
    from tests.models.conftest import build_tiny

    build_tiny("lfm2", tmp_path)
    model = load_model(tmp_path, "float32")
    assert not model.positional_cache
    e = Engine(model, max_batch=2, max_context=32, length_buckets=(16, 32), warmup=False, start=False)
    assert not e.runner.keep_prefixes and e.scheduler.prefixes is None


@pytest.mark.slow
def test_chat_usage_reports_cached_tokens_and_metrics_count_them():
    """The real pipeline (tiny Qwen2 with the Qwen2.5 template): turn 2 of a tool conversation reuses turn 1's
    tokens, reported as usage.prompt_tokens_details.cached_tokens and on /metrics; with reuse off the same
    turn reports 0 and the same reply."""
    from jaxchat.api import build_chat_service
    from jaxchat.api.request import parse_chat_request, parse_completion_request
    from jaxchat.server.metrics import Metrics
    from tests.reliability.tiny import tiny_checkpoint

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    shapes = {"max_batch": 2, "max_context": 512, "length_buckets": (64, 512), "batch_buckets": (2,),
              "span_buckets": (512,)}

    def conversation(service):
        async def turns():
            msgs = [{"role": "system", "content": "You are terse. " * 20},
                    {"role": "user", "content": "Weather in Paris?"}]
            body = {"model": "m", "messages": msgs, "tools": tools, "tool_choice": "required", "max_tokens": 40,
                    "temperature": 0}
            first = await service.chat_completion(parse_chat_request(body))
            msg = first["choices"][0]["message"]
            msgs += [{"role": "assistant", "content": None, "tool_calls": msg["tool_calls"]},
                     {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "sunny, 21 C"}]
            second_body = parse_chat_request({**body, "messages": msgs, "tool_choice": "none", "max_tokens": 8})
            second = await service.chat_completion(second_body)
            # /v1/completions on turn 2's prompt ids: the row holds all of them (the last one is always run)
            ids = list(service.prepare_chat(second_body).prompt_ids)
            third = await service.completion(parse_completion_request({"model": "m", "prompt": ids, "max_tokens": 1}))
            return first, second, (third, len(ids))

        return asyncio.run(turns())

    on = build_chat_service(tiny_checkpoint(), **shapes)
    try:
        first, second, (third, third_prompt) = conversation(on)
        metrics = Metrics(on).render().decode()
    finally:
        on.close()
    off = build_chat_service(tiny_checkpoint(), **shapes, prefix_cache=False)
    try:
        first_off, second_off, (third_off, _) = conversation(off)
    finally:
        off.close()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert 0.5 * first["usage"]["prompt_tokens"] < cached < second["usage"]["prompt_tokens"]
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] == third_prompt - 1
    assert third_off["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert f"jaxchat_prefix_cache_hit_tokens_total {float(cached + third_prompt - 1)}" in metrics
    assert second_off["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert first_off["choices"][0]["message"]["tool_calls"][0]["function"] == msg_function(first)
    assert second_off["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]


def msg_function(completion: dict) -> dict:
    return completion["choices"][0]["message"]["tool_calls"][0]["function"]


def test_a_burst_repeating_the_prompt_of_the_burst_before_takes_its_rows_without_copies(engines):
    """Two requests of one short prompt run together and finish in the same step; the same two again each
    reuse all but the last prompt token from the row they are placed in: no swap, no copy, the same replies."""
    on, _ = engines
    sched = on.scheduler
    prompt = TOK.encode("hi there")

    def burst():
        got = {i: [] for i in range(2)}
        for i in range(2):
            s = SamplingParams(max_tokens=3 * len(prompt), ignore_eos=True)  # the reply outweighs the prompt
            sched.submit(GenerationRequest(list(prompt), s, None, f"burst.{i}"), got[i].append)
        while sched.has_work():
            sched.step()
        return ([[t for o in got[i] for t in o.token_ids] for i in range(2)],
                [got[i][-1].num_cached_tokens for i in range(2)])

    first, _ = burst()
    calls, restore = count_calls(on.runner, ("swap", "move"))
    try:
        again, cached = burst()
    finally:
        restore()
    assert again == first and cached == [len(prompt) - 1] * 2
    assert calls == {"swap": 0, "move": 0}
