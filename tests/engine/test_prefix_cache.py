"""Prefix caching by pages: a prompt that starts with the tokens of full pages an earlier request left (its
previous turn, a shared system prompt) maps those pages and runs only the rest; greedy outputs are the same with
caching on and off, over conversations that take turns in any order and turns that end on a stop token or on
their length; the hits are counted (`prefix_hit_tokens`, usage.prompt_tokens_details.cached_tokens,
/metrics); models with recurrent layers never share."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxchat.engine.engine import Engine
from jaxchat.engine.types import GenerationRequest, SamplingParams
from tests.engine.helpers import FakeModel, byte_tokenizer

TOK = byte_tokenizer()
EOS = TOK.convert_tokens_to_ids("<|im_end|>")


@pytest.fixture(scope="module")
def engines():
    """The same tiny model twice: prefix caching on and off; 2 slots, so 3 conversations compete for them, and
    a pool of 20 pages of 4 tokens, so cached pages are evicted too."""
    shapes = {"max_batch": 2, "max_context": 128, "max_step_tokens": 64, "page_size": 4, "num_pages": 21,
              "start": False}
    on = Engine(FakeModel(TOK, eos=(EOS,)), **shapes)
    off = Engine(FakeModel(TOK, eos=(EOS,)), **shapes, prefix_cache=False)
    assert on.scheduler.pool.prefix_caching and not off.scheduler.pool.prefix_caching
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
            engine.core.step()
        while engine.core.has_work():
            engine.core.step()
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
    members = {c for r in rounds for c in r}
    if len(members) == 1 and members <= {0, 2} and any(turn > 0 for _, turn in with_reuse):
        assert cached > 0  # a conversation alone finds its previous turn's pages (odd ones have a repetition
        # penalty: they reuse nothing, their prompt masks are built from the tokens run)


def test_recurrent_models_never_reuse(tmp_path):
    """LFM2 keeps a convolution window per row: its state at position n depends on the tokens after n, so
    the runner turns reuse off whatever the engine asks."""
    from jaxchat.models import load_model
    from tests.models.conftest import build_tiny

    build_tiny("lfm2", tmp_path)
    model = load_model(tmp_path, "float32")
    assert not model.positional_cache
    e = Engine(model, max_batch=2, max_context=32, max_step_tokens=16, warmup=False, start=False)
    assert not e.runner.prefix_reuse and not e.scheduler.pool.prefix_caching
    e.shutdown()


@pytest.mark.slow
def test_chat_usage_reports_cached_tokens_and_metrics_count_them():
    """The real pipeline (tiny Qwen2 with the Qwen2.5 template): turn 2 of a tool conversation reuses turn 1's
    tokens, reported as usage.prompt_tokens_details.cached_tokens and on /metrics; with reuse off the same
    turn reports 0 and the same reply."""
    from jaxchat.api import build_chat_service
    from jaxchat.api.request import parse_chat_request, parse_completion_request
    from jaxchat.server.metrics import Metrics
    from tests.reliability.tiny import tiny_checkpoint
    from tests.tiny_model import SERVE_SHAPES

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    shapes = SERVE_SHAPES

    def conversation(service):
        async def turns():
            msgs = [{"role": "system", "content": "You are terse. " * 20},
                    {"role": "user", "content": "Weather in Paris?"}]
            body = {"model": "m", "messages": msgs, "tools": tools, "tool_choice": "required", "max_tokens": 40,
                    "temperature": 0}
            first = await service.chats.answer(parse_chat_request(body))
            msg = first["choices"][0]["message"]
            msgs += [{"role": "assistant", "content": None, "tool_calls": msg["tool_calls"]},
                     {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "sunny, 21 C"}]
            second_body = parse_chat_request({**body, "messages": msgs, "tool_choice": "none", "max_tokens": 8})
            second = await service.chats.answer(second_body)
            # /v1/completions on turn 2's prompt ids: its full pages are cached (the last token is always run)
            ids = list(service.prepare_chat(second_body).prompt_ids)
            third = await service.texts.answer(parse_completion_request({"model": "m", "prompt": ids, "max_tokens": 1}))
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
    page = on.engine.scheduler.pool.page_size
    third_cached = third["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert third_cached == (third_prompt - 1) // page * page
    assert third_off["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert f"jaxchat_prefix_cache_hit_tokens_total {float(cached + third_cached)}" in metrics
    assert second_off["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert first_off["choices"][0]["message"]["tool_calls"][0]["function"] == msg_function(first)
    assert second_off["choices"][0]["message"]["content"] == second["choices"][0]["message"]["content"]


def msg_function(completion: dict) -> dict:
    return completion["choices"][0]["message"]["tool_calls"][0]["function"]
