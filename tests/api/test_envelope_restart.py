"""A reply that opens with a call envelope goes on in the format's own syntax (`jaxchat.api.envelope_restart`):
the first generation is aborted once its call is decided, a second runs from the prompt and the native
opening of that call, and the client sees the native reply's calls, streamed and not the same, with the
envelope's text never sent. Text before the envelope, JSON naming no tool and logprobs keep the one
generation. (The auto grammar's acceptance of the opening and of what follows it:
`tests/constrain/test_accepts_envelopes.py`.)

A scripted engine on the real Qwen2.5 template (hermes_json) streams its replies in small pieces.
"""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from jaxchat.api import ChatService
from jaxchat.chat import chat_format_make, native_call_opening
from jaxchat.engine.types import GenerationOutput
from jaxchat.server import create_app
from tests.api.test_service import WEATHER, ScriptedEngine, _both

BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
FENCED = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'
NATIVE_REST = ('{"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}'
               '\n</tool_call>')
BODY = {"messages": [{"role": "user", "content": "hello"}], "tools": [WEATHER], "max_tokens": 200}
BOTH_CALLS = [{"name": "get_weather", "arguments": '{"city": "Paris"}'},
              {"name": "get_weather", "arguments": '{"city": "Rome"}'}]


class TwoActEngine(ScriptedEngine):
    """The first request of each pair gets `reply`, the one that follows a native opening `native_rest`, each
    three characters a delta; records the prompts, and which generations were closed before their end."""

    def __init__(self, template: str) -> None:
        super().__init__(template, unknown=True)
        self.native_rest, self.native_finish = NATIVE_REST, "stop"
        self.opening_ids = self.tokenizer.encode(native_call_opening(chat_format_make("hermes_json"), "get_weather"),
                                                 add_special_tokens=False)
        self.closed_early = 0

    async def generate(self, request):
        self.prompts.append(list(request.prompt_ids))
        native = list(request.prompt_ids[-len(self.opening_ids):]) == self.opening_ids
        text, finish, stop_reason = (self.native_rest, self.native_finish, 2) if native else self.reply
        pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
        finished = False
        try:
            for i, piece in enumerate(pieces):
                finished = i == len(pieces) - 1
                yield GenerationOutput("r", [1], piece, finished, finish if finished else None,
                                       stop_reason if finished else None, num_prompt_tokens=len(request.prompt_ids),
                                       num_generated_tokens=i + 1)
        finally:
            self.closed_early += not finished


@pytest.fixture
def hermes():
    from jaxchat.assets import template_path

    engine = TwoActEngine(template_path("Qwen-Qwen2.5-7B-Instruct.jinja").read_text())
    service = ChatService(engine, "hermes")
    assert service.spec.kind == "hermes_json"
    with TestClient(create_app(service)) as c:
        yield engine, c


def _calls(choice: dict) -> list[dict]:
    return [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
            for c in choice["message"].get("tool_calls") or ()]


@pytest.mark.parametrize("lead", ["", "\n  ", "\r\n"], ids=["at_start", "after_whitespace", "after_crlf"])
def test_a_reply_opening_with_a_fenced_call_goes_on_natively(hermes, lead):
    engine, client = hermes
    engine.reply = (lead + FENCED, "stop", 2)
    choice, streamed = _both(client, BODY)
    assert _calls(choice) == streamed["tool_calls"] == BOTH_CALLS
    assert not choice["message"]["content"] and not streamed["content"]
    assert choice["finish_reason"] == streamed["finish_reason"] == "tool_calls"
    first, second = engine.prompts[:2]
    assert second == first + engine.opening_ids
    assert engine.prompts[2:] == [first, second] and engine.closed_early == 2


def test_the_usage_counts_the_native_reply(hermes):
    engine, client = hermes
    engine.reply = (FENCED, "stop", 2)
    usage = client.post("/v1/chat/completions", json=BODY).json()["usage"]
    pieces = -(-len(NATIVE_REST) // 3)
    assert usage["completion_tokens"] == len(engine.opening_ids) + pieces
    assert usage["prompt_tokens"] == len(engine.prompts[0])


@pytest.mark.parametrize(("reply", "extra"), [
    ("Let me check.\n" + FENCED, {}),
    ('```json\n{"name": "John", "arguments": {"age": 3}}\n```', {}),
    (FENCED, {"logprobs": True}),
    (FENCED, {"tool_choice": "none"}),
    ("\r" + BARE, {}),
], ids=["text_before", "names_no_tool", "logprobs", "tool_choice_none", "after_a_lone_cr"])
def test_other_replies_keep_their_one_generation(hermes, reply, extra):
    engine, client = hermes
    engine.reply = (reply, "stop", 2)
    choice, _ = _both(client, {**BODY, **extra})
    assert len(engine.prompts) == 2 and engine.closed_early == 0
    if reply.startswith("Let me"):
        assert _calls(choice) == BOTH_CALLS[:1] and choice["message"]["content"] == "Let me check."
    elif "logprobs" in extra:  # the envelope's one call, read as it was written
        assert _calls(choice) == BOTH_CALLS[:1] and not choice["message"]["content"]
    else:
        assert choice["message"]["content"].lstrip("\r") == reply.lstrip("\r") and not _calls(choice)


@pytest.mark.parametrize(("reply", "stop"), [(BARE, "\n"), (BARE, "<tool_call>"), (FENCED, '": {"')],
                         ids=["inside", "the_marker", "over_its_end"])
def test_a_stop_string_the_native_opening_would_meet_keeps_one_generation(hermes, reply, stop):
    """Had the model written the opening itself, a stop string in it (or one that begins at its end) would
    have ended the reply there: the reply is not restarted but read as it was written."""
    engine, client = hermes
    engine.reply = (reply, "stop", 2)
    choice, streamed = _both(client, {**BODY, "stop": [stop]})
    assert len(engine.prompts) == 2 and engine.closed_early == 0
    assert _calls(choice) == streamed["tool_calls"] == BOTH_CALLS[:1]


def test_a_reply_cut_before_the_call_is_decided_is_released_as_it_was(hermes):
    engine, client = hermes
    engine.reply = (FENCED[:FENCED.index('"arguments"')], "length", None)
    choice, streamed = _both(client, BODY)
    assert len(engine.prompts) == 2 and engine.closed_early == 0
    assert choice["message"]["content"] == streamed["content"] == "" and not _calls(choice)
    assert choice["finish_reason"] == streamed["finish_reason"] == "length"



ROME = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
PARIS_AGAIN = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>'


@pytest.mark.parametrize(("rest", "finish"), [
    ('{"city": "Paris"}}\n</tool_call>\n' + ROME + "\n" + PARIS_AGAIN + "\n" + ROME, "stop"),
    ('{"city": "Paris"}}\n</tool_call>\n' + ROME + "\n" + (PARIS_AGAIN + "\n" + ROME + "\n") * 5 + PARIS_AGAIN[:30],
     "length"),
], ids=["repeat", "repeats_until_cut"])
def test_a_restarted_reply_ends_before_a_call_it_repeats(hermes, rest, finish):
    """Put in its own syntax, a small model may go on repeating its calls; the reply ends before the first call
    equal to an earlier one (same name, equal arguments), streamed and not alike, and the generation stops."""
    engine, client = hermes
    engine.reply, engine.native_rest = (FENCED, "stop", 2), rest
    engine.native_finish = finish
    choice, streamed = _both(client, BODY)
    assert _calls(choice) == streamed["tool_calls"] == BOTH_CALLS
    assert not choice["message"]["content"] and not streamed["content"]
    assert choice["finish_reason"] == streamed["finish_reason"] == "tool_calls"
    assert engine.closed_early == 4  # both envelopes, both repeating native replies
    # usage counts what was sent: the opening and the native reply's deltas up to the one the repeat begins in
    usage = client.post("/v1/chat/completions", json=BODY).json()["usage"]
    repeat = rest.index(PARIS_AGAIN)
    assert usage["completion_tokens"] == len(engine.opening_ids) + -(-repeat // 3) < len(engine.opening_ids) + -(
        -len(rest) // 3)


def test_text_after_the_calls_is_content_once_released(hermes):
    engine, client = hermes
    engine.reply, engine.native_rest = (FENCED, "stop", 2), NATIVE_REST + "\n</tool_call_result> done <"
    choice, streamed = _both(client, BODY)
    assert _calls(choice) == streamed["tool_calls"] == BOTH_CALLS
    assert choice["message"]["content"] == streamed["content"] == "</tool_call_result> done <"


def test_the_opening_ends_where_the_model_writes_its_next_token():
    """The native opening `...arguments": ` ends in a space that a BPE tokenizer folds into the next token
    (` {"`): the second generation's prompt ends before it, and the model writes the space itself."""
    spec, tokenized = chat_format_make("hermes_json"), []
    prompts, outputs = _restart_run({"tokenize": lambda text: (tokenized.append(text), [9] * len(text))[1]}, {})
    text = "".join(out.text for out in outputs)
    opening = native_call_opening(spec, "get_weather")
    assert opening.endswith('"arguments": ') and tokenized == [opening.rstrip(" ")]
    assert text == opening.rstrip(" ") + ' {"city": "Paris"}}\n</tool_call>'
    assert prompts[1] == [1, 2] + [9] * len(opening.rstrip(" "))


def _restart_run(plan_changes: dict, sampling: dict, cached=(5, 16)):
    """Prompts and outputs of `restarted` over an engine whose first reply is FENCED, cached tokens
    `cached[i]` for its i-th generation; the plan's tokenizer gives one token 9 per character."""
    import asyncio
    from dataclasses import replace

    from jaxchat.api.envelope_restart import RestartPlan, restarted
    from jaxchat.engine.types import GenerationRequest, SamplingParams

    spec, prompts = chat_format_make("hermes_json"), []

    class Engine:
        async def generate(self, request):
            prompts.append(request.prompt_ids)
            text = FENCED if len(prompts) == 1 else ' {"city": "Paris"}}\n</tool_call>'
            n = len(prompts) - 1
            for i, piece in enumerate(text):
                yield GenerationOutput("r", [7], piece, i == len(text) - 1, "stop" if i == len(text) - 1 else None,
                                       num_cached_tokens=cached[n], num_generated_tokens=i + 1)

    plan = replace(RestartPlan(frozenset({"get_weather"}), lambda name: native_call_opening(spec, name),
                               lambda text: [9] * len(text), _no_grammar, (spec.tool_start, spec.tool_end)),
                   **plan_changes)

    async def reply():
        request = GenerationRequest([1, 2], SamplingParams(**{"max_tokens": 100, **sampling}))
        return [out async for out in restarted(Engine(), request, plan)]

    return prompts, asyncio.run(reply())


async def _no_grammar(opening):
    return None


async def _failing_grammar(opening):
    raise RuntimeError("cannot compile")


@pytest.mark.parametrize(("plan_changes", "sampling"), [
    ({"fits": lambda tokens: tokens < 10}, {}),
    ({}, {"stop_token_ids": (9,)}),
    ({"constraint": _failing_grammar}, {}),
], ids=["prompt_too_long_for_the_pool", "a_stop_token_in_the_opening", "no_grammar_after_the_opening"])
def test_a_restart_that_could_not_be_as_if_the_model_wrote_it_keeps_one_generation(plan_changes, sampling):
    prompts, outputs = _restart_run(plan_changes, sampling)
    assert len(prompts) == 1 and "".join(out.text for out in outputs) == FENCED


def test_a_restarted_reply_reports_the_first_generations_cached_tokens():
    """The second generation finds the prompt's pages the first just computed; the request's cached tokens
    are what the first found."""
    prompts, outputs = _restart_run({}, {})
    assert len(prompts) == 2 and len(prompts[1]) > len(prompts[0])
    assert outputs and {out.num_cached_tokens for out in outputs} == {5}


def test_the_restarts_grammar_compiles_beside_the_first_generation_and_off_the_event_loop():
    """The pipeline's plan: `prepare` (started with the first generation) compiles the calls-only grammar on the
    grammar engine's thread while the event loop goes on; the restart's constraint then finds it compiled."""
    import asyncio
    import threading
    import time
    from types import SimpleNamespace

    from jaxchat.api.pipeline import ChatPipeline
    from jaxchat.api.request import parse_chat_request
    from jaxchat.assets import template_path
    from jaxchat.constrain.grammar_engine import GrammarEngine
    from jaxchat.engine.types import GenerationRequest, SamplingParams

    engine = TwoActEngine(template_path("Qwen-Qwen2.5-7B-Instruct.jinja").read_text())
    engine.prompt_fits = lambda tokens: True
    grammar = GrammarEngine(engine.tokenizer, vocab_size=len(engine.tokenizer))
    pipeline = ChatPipeline(engine, "hermes", grammar)
    prepared = pipeline.prepare_chat(parse_chat_request(BODY))  # compiles the request's own (auto) grammar
    plan = pipeline.restart_plan(prepared, GenerationRequest([1], SamplingParams(max_tokens=50)))
    compiles, real = [], grammar.compiler

    def slow_compile(key):
        time.sleep(0.3)
        compiles.append(threading.current_thread().name)
        return real.compile_structural_tag(key)

    grammar.compiler = SimpleNamespace(compile_structural_tag=slow_compile)
    opening = native_call_opening(pipeline.spec, "get_weather")

    async def run():
        ticks, done = 0, asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                ticks += 1
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        await plan.prepare()
        during = ticks
        constraint = await plan.constraint(opening)
        done.set()
        await task
        return during, constraint

    ticks, constraint = asyncio.run(run())
    assert compiles == ["grammar-compile"]  # one compile, on the grammar engine's thread, by `prepare`
    assert ticks >= 10  # the loop ran all through it (0.3 s at 10 ms a tick)
    assert constraint is not None and not constraint.is_terminated()


@pytest.mark.parametrize(("reply", "prepared"), [(FENCED, 1), ("Hello, I cannot call a tool here.", 0)],
                         ids=["an_envelope_begins", "plain_text"])
def test_the_restarts_grammar_is_prepared_only_once_a_reply_begins_like_an_envelope(reply, prepared):
    import asyncio

    from jaxchat.api.envelope_restart import RestartPlan, restarted
    from jaxchat.engine.types import GenerationRequest, SamplingParams

    spec, calls = chat_format_make("hermes_json"), []

    class Engine:
        async def generate(self, request):  # a delta a step, the event loop running between them
            for i, piece in enumerate(reply):
                await asyncio.sleep(0)
                yield GenerationOutput("r", [7], piece, i == len(reply) - 1, "stop" if i == len(reply) - 1 else None)

    async def prepare():
        calls.append(1)

    plan = RestartPlan(frozenset({"get_weather"}), lambda name: native_call_opening(spec, name),
                       lambda text: [9] * len(text), _no_grammar, (spec.tool_start, spec.tool_end), prepare=prepare)

    async def run():
        request = GenerationRequest([1, 2], SamplingParams(max_tokens=100))
        return [out async for out in restarted(Engine(), request, plan)]

    asyncio.run(run())
    assert len(calls) == prepared
