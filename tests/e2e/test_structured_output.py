"""Structured output through the real pipeline: regex, choice, EBNF grammar and JSON schema fields (vLLM's, SGLang's,
llama.cpp's) on Chat Completions and Completions, streamed == not streamed, with and without speculative decoding;
the bad ones are 400s with an OpenAI error body naming the field, and the server stays healthy.

A tiny random Qwen2 with the real Qwen2.5 tokenizer (`tests.tiny_model`), on the engine shapes of
`test_stream_agreement` (one decode and one prefill program, loaded from the run's compilation cache). The model
writes gibberish, so every check is of the grammar: the text `re.fullmatch`es the regex, is one of the choices,
is accepted to its end by xgrammar's own matcher for the EBNF, parses as JSON of the schema.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import pytest

from jaxchat.api import parse_chat_request, parse_completion_request
from tests.tiny_model import tiny_chat_model

PHONE = r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}"
CHOICES = ["yes", "no", "maybe not", 'say "hi"']
EBNF = 'root ::= pet ", " pet ("." | "!")\npet ::= "cat" | "dog" | [0-9]{1,3} " fish"'
SCHEMA = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}, "days": {"type": "integer"}},
          "required": ["city", "days"], "additionalProperties": False}

# field family -> (body fields, check of the text)
CASES = {
    "vllm_regex": ({"structured_outputs": {"regex": PHONE}}, "regex"),
    "vllm_choice": ({"structured_outputs": {"choice": CHOICES}}, "choice"),
    "vllm_grammar": ({"structured_outputs": {"grammar": EBNF}}, "grammar"),
    "vllm_json": ({"structured_outputs": {"json": SCHEMA}}, "json"),
    "guided_regex": ({"guided_regex": PHONE}, "regex"),
    "guided_choice": ({"guided_choice": CHOICES}, "choice"),
    "sglang_ebnf": ({"ebnf": EBNF}, "grammar"),
    "sglang_json_schema": ({"json_schema": json.dumps(SCHEMA)}, "json"),
    "llamacpp_grammar": ({"grammar": EBNF}, "grammar"),
    "llamacpp_json_schema": ({"json_schema": SCHEMA}, "json"),
}


@pytest.fixture(scope="module")
def services(tmp_path_factory):
    from jaxchat.api import build_chat_service

    shapes = {"max_batch": 8, "max_context": 512, "decode_rows": (8,), "step_token_buckets": (256,)}
    qwen25 = tiny_chat_model(tmp_path_factory.mktemp("qwen25"))
    # the speculative service compiles its verify program up front: under the test run's first set alone
    # (JAXCHAT_PROGRAMS=first, tests/conftest.py) it would never draft
    made = {"plain": build_chat_service(qwen25, speculative="off", **shapes),
            "speculative": build_chat_service(qwen25, speculative="ngram", programs="all", **shapes)}
    yield made
    for service in made.values():
        service.engine.shutdown()


def _ebnf_accepts(service, text: str) -> bool:
    import xgrammar as xgr

    compiler = service.grammar.compiler
    matcher = xgr.GrammarMatcher(compiler.compile_grammar(EBNF), terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


def _check(service, kind: str, text: str) -> None:
    if kind == "regex":
        assert re.fullmatch(PHONE, text), text
    elif kind == "choice":
        assert text in CHOICES, text
    elif kind == "grammar":
        assert _ebnf_accepts(service, text), text
    else:
        value = json.loads(text)
        assert value["city"] in ("Paris", "Rome") and isinstance(value["days"], int) and set(value) == {"city", "days"}


def _chat(service, body: dict) -> tuple[str, str]:
    """(text not streamed, text streamed)."""
    async def run():
        plain = await service.chats.answer(parse_chat_request(body))
        chunks = [c async for c in service.chats.stream(parse_chat_request({**body, "stream": True}))]
        streamed = "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])
        assert plain["choices"][0]["finish_reason"] == "stop"
        return plain["choices"][0]["message"]["content"], streamed

    return asyncio.run(run())


def _completion(service, body: dict) -> tuple[str, str]:
    async def run():
        plain = await service.texts.answer(parse_completion_request(body))
        chunks = [c async for c in service.texts.stream(parse_completion_request({**body, "stream": True}))]
        assert plain["choices"][0]["finish_reason"] == "stop"
        return plain["choices"][0]["text"], "".join(ch["text"] for c in chunks for ch in c["choices"])

    return asyncio.run(run())


@pytest.mark.parametrize("case", sorted(CASES))
def test_chat_output_follows_the_field(services, case):
    """Every field family constrains a chat reply; streamed == not streamed; speculative decoding gives the same."""
    fields, kind = CASES[case]
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Answer."}], "max_tokens": 60,
            "temperature": 0, **fields}
    plain, streamed = _chat(services["plain"], body)
    _check(services["plain"], kind, plain)
    assert streamed == plain
    if case.startswith("vllm_"):  # one spelling per kind is enough for the drafts
        assert _chat(services["speculative"], body) == (plain, plain)


@pytest.mark.parametrize("fields,kind", [
    ({"guided_regex": PHONE}, "regex"),
    ({"structured_outputs": {"choice": CHOICES}}, "choice"),
    ({"grammar": EBNF}, "grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}}, "json"),
])
def test_completion_output_follows_the_field(services, fields, kind):
    body = {"model": "tiny", "prompt": "The answer is", "max_tokens": 60, "temperature": 0, **fields}
    plain, streamed = _completion(services["plain"], body)
    _check(services["plain"], kind, plain)
    assert streamed == plain
    assert _completion(services["speculative"], body) == (plain, plain)


def test_sampled_choices_are_choices(services):
    """At temperature 1 with n=4 every choice is still one of the strings (the mask, not luck)."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Pick."}], "temperature": 1.0, "seed": 7,
            "n": 4, "guided_choice": CHOICES}
    reply = asyncio.run(services["plain"].chats.answer(parse_chat_request(body)))
    assert [c["message"]["content"] in CHOICES for c in reply["choices"]] == [True] * 4


BAD = {
    "unbalanced regex": ({"guided_regex": "(ab"}, "guided_regex", "parenthesis"),
    "ebnf syntax": ({"ebnf": 'root ::= "a'}, "ebnf", "EBNF"),
    "gbnf bad class": ({"grammar": "root ::= [z-a]"}, "grammar", "lower bound"),
    "no root rule": ({"structured_outputs": {"grammar": 'start ::= "a"'}}, "structured_outputs.grammar", "root"),
    # grammars that match nothing, though their first token mask allows "a" / "b": refused before decoding
    "regex of nothing": ({"guided_regex": r"a{0}b[^\s\S]"}, "guided_regex", "matches no text"),
    "ebnf of nothing": ({"ebnf": 'root ::= "a" root'}, "ebnf", "matches no text"),
    "gbnf of nothing": ({"grammar": 'root ::= x\nx ::= "b" x | "c" x'}, "grammar", "matches no text"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_grammars_are_400s_and_the_server_stays_healthy(services, case):
    from starlette.testclient import TestClient

    from jaxchat.server import create_app

    fields, param, words = BAD[case]
    with TestClient(create_app(services["plain"])) as client:
        for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
                           ("/v1/completions", {"prompt": "x"})):
            r = client.post(path, json={"max_tokens": 4, **body, **fields})
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["param"] == param and error["type"] == "invalid_request_error"
            assert words.lower() in error["message"].lower(), error["message"]
            r = client.post(path, json={"max_tokens": 4, **body, "guided_regex": "[0-9]{2}"})
            assert r.status_code == 200, r.text


def test_a_pathological_grammar_hits_the_time_limit(services):
    """A compile past the limit is a 400 naming the field (at once the second time), not a hang."""
    from jaxchat.chat import RequestError

    service = services["plain"]
    grammar = service.grammar
    limit, grammar.compile_timeout_s = grammar.compile_timeout_s, 0.01
    body = {"model": "tiny", "prompt": "x", "max_tokens": 4, "guided_regex": "[a-z]{1,5000}[0-9]{1,5000}"}
    try:
        for _ in range(2):
            with pytest.raises(RequestError) as err:
                asyncio.run(service.texts.answer(parse_completion_request(body)))
            assert err.value.param == "guided_regex" and "time limit" in err.value.message, err.value.message
    finally:
        grammar.compile_timeout_s = limit


class _HeldCompiler:
    """The grammar engine's compiler, holding back the compile of any tag that contains `marker` until released."""

    def __init__(self, real, marker: str) -> None:
        self.real, self.marker, self.release, self.entered = real, marker, threading.Event(), threading.Event()

    def compile_structural_tag(self, key: str):
        if self.marker in key:
            self.entered.set()
            self.release.wait(60)
        return self.real.compile_structural_tag(key)

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_the_server_answers_while_a_grammar_compiles(services):
    """A slow compile runs off the event loop: /health and other requests are answered while it runs; past the
    time limit it is a 400 naming the field while the compile goes on on its own thread."""
    import httpx

    from tests.server.conftest import Live

    service = services["plain"]
    grammar = service.grammar
    real, limit = grammar.compiler, grammar.compile_timeout_s
    held = grammar.compiler = _HeldCompiler(real, "held[0-9]")
    try:
        with Live(service) as live, httpx.Client(base_url=live.base_url, timeout=60) as client:
            answers: dict = {}
            for path, body in (("/v1/completions", {"prompt": "x"}),
                               ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})):
                pattern = f"held[0-9]{path.count('chat')}"  # a new tag each time, the same marker
                slow = threading.Thread(target=lambda b=body, p=path, r=pattern: answers.__setitem__(p, client.post(
                    p, json={"max_tokens": 4, **b, "guided_regex": r})))
                held.entered.clear()
                slow.start()
                assert held.entered.wait(30)
                t0 = time.monotonic()
                assert client.get("/health").status_code == 200
                other = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "guided_regex": "[0-9]{2}"})
                assert other.status_code == 200 and re.fullmatch("[0-9]{2}", other.json()["choices"][0]["text"])
                assert time.monotonic() - t0 < 20 and slow.is_alive()  # answered while the compile is held
                held.release.set()
                slow.join(60)
                held.release.clear()
                assert answers[path].status_code == 200, answers[path].text
            # past the time limit: a 400 naming the field, the server still answering
            grammar.compile_timeout_s = 0.5
            r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "guided_regex": "held[0-9]{3}"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "guided_regex", r.text
            assert "time limit" in r.json()["error"]["message"]
            assert client.get("/health").status_code == 200
    finally:
        held.release.set()
        grammar.compiler, grammar.compile_timeout_s = real, limit


def test_concurrent_requests_share_one_compile(services):
    """Requests that arrive together with the same new grammar wait for one compile, not one each."""
    from jaxchat.api import parse_completion_request

    service = services["plain"]
    grammar = service.grammar
    real = grammar.compiler
    calls: list[str] = []

    class Counting:
        def compile_structural_tag(self, key):
            calls.append(key)
            time.sleep(0.2)
            return real.compile_structural_tag(key)

        def __getattr__(self, name):
            return getattr(real, name)

    grammar.compiler = Counting()
    body = {"model": "tiny", "prompt": "x", "max_tokens": 3, "temperature": 0, "guided_regex": "shared[0-9]{2}"}

    async def run():
        return await asyncio.gather(*(service.texts.answer(parse_completion_request(body)) for _ in range(4)))

    try:
        replies = asyncio.run(run())
    finally:
        grammar.compiler = real
    assert len({r["choices"][0]["text"] for r in replies}) == 1
    assert len(calls) == len(set(calls)), calls


def _tokens(service, body: dict) -> list[int]:
    async def run():
        return (await service.texts.generate(parse_completion_request(body))).token_ids

    return asyncio.run(run())


def test_logit_bias_bans_and_favours_tokens(services):
    """-100 bans the token greedy decoding would have chosen; +100 makes another one the choice at every step; the
    same with speculative decoding; the bias works beside a grammar's mask."""
    body = {"model": "tiny", "prompt": "The weather in Paris is", "max_tokens": 4, "temperature": 0}
    plain = _tokens(services["plain"], body)
    banned = {**body, "logit_bias": {str(plain[0]): -100}}
    for name in ("plain", "speculative"):
        assert _tokens(services[name], banned)[0] != plain[0]
    favoured = 9707 if plain[0] != 9707 else 1234
    for name in ("plain", "speculative"):
        assert _tokens(services[name], {**body, "logit_bias": {str(favoured): 100}}) == [favoured] * 4
    # beside a grammar's mask: favouring the first token of the choice greedy did not take makes it the output
    service = services["plain"]
    choice_body = {**body, "max_tokens": 10, "guided_choice": ["Sunny", "Rain"]}
    first = asyncio.run(service.texts.generate(parse_completion_request(choice_body)))
    want = "Rain" if first.text == "Sunny" else "Sunny"
    head = service.tokenizer.encode(want, add_special_tokens=False)[0]
    favoured = parse_completion_request({**choice_body, "logit_bias": {str(head): 100}})
    other = asyncio.run(service.texts.generate(favoured))
    assert first.text in ("Sunny", "Rain") and other.text == want


def test_logit_bias_out_of_the_vocabulary_is_a_400(services):
    from starlette.testclient import TestClient

    from jaxchat.server import create_app

    with TestClient(create_app(services["plain"])) as client:
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "logit_bias": {"999999": 5}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias.999999", r.text


def test_honoured_sampling_fields_change_the_output_as_documented(services):
    """The honoured sampling fields of docs/api.md's table, each against greedy decoding of the same prompt."""
    service = services["plain"]
    body = {"model": "tiny", "prompt": "Say the words wind rain snow sun cloud, wind rain", "max_tokens": 16,
            "temperature": 0, "ignore_eos": True}

    def gen(**extra):
        return asyncio.run(service.texts.generate(parse_completion_request({**body, **extra})))

    greedy = gen()
    assert len(greedy.token_ids) == 16  # ignore_eos: exactly max_tokens
    assert gen(max_tokens=3).token_ids == greedy.token_ids[:3]
    assert gen(n_predict=3, max_tokens=None).token_ids == greedy.token_ids[:3]  # llama.cpp's alias
    assert gen(ignore_eos=False, stop_token_ids=[greedy.token_ids[2]]).token_ids[-1] == greedy.token_ids[2]
    cut = gen(stop=[greedy.text[4:8]])
    assert greedy.text.startswith(cut.text) and len(cut.text) < len(greedy.text)
    for narrowing in ({"top_k": 1}, {"min_p": 1.0}, {"top_p": 1e-6}):  # leave only the most likely token
        assert gen(temperature=1.5, seed=1, **narrowing).token_ids == greedy.token_ids, narrowing
    drawn = gen(temperature=1.5, seed=1)
    assert drawn.token_ids == gen(temperature=1.5, seed=1).token_ids != greedy.token_ids  # seed: reproducible
    assert gen(temperature=1.5, seed=2).token_ids != drawn.token_ids
    for penalty in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}, {"repetition_penalty": 3.0},
                    {"repeat_penalty": 3.0}):
        assert gen(**penalty).token_ids != greedy.token_ids, penalty
    reply = asyncio.run(service.texts.answer(parse_completion_request({**body, "n": 3, "temperature": 1.5, "seed": 4})))
    assert len({c["text"] for c in reply["choices"]}) == 3


# ---- OpenAI custom tools (Chat Completions) ----------------------------------------------------------------------
CALL_REGEX = r"[a-z]{1,8}( [a-z]{1,8}){0,2}"
CALL_LARK = r"""
start: NAME "(" (ARG ("," ARG)?)? ")"
NAME: /[a-z]{1,6}/
ARG: /[0-9]{1,3}/
"""


def _custom(name: str, syntax: str | None = None, definition: str = "") -> dict:
    fmt = {"type": "text"} if syntax is None else {"type": "grammar", "grammar": {"syntax": syntax,
                                                                                 "definition": definition}}
    return {"type": "custom", "custom": {"name": name, "description": "Run it.", "format": fmt}}


CUSTOM_TOOLS = [_custom("words", "regex", CALL_REGEX), _custom("call", "lark", CALL_LARK), _custom("note")]
FUNCTION = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}}, "required": ["city"]}}}


def _check_call(call: dict) -> None:
    from lark import Lark

    if call["type"] == "function":
        assert json.loads(call["function"]["arguments"])["city"] in ("Paris", "Rome")
        return
    name, text = call["custom"]["name"], call["custom"]["input"]
    if name == "words":
        assert re.fullmatch(CALL_REGEX, text), text
    elif name == "call":
        Lark(CALL_LARK).parse(text)
    else:
        assert isinstance(text, str)


def _calls_both(service, body: dict) -> list[dict]:
    """The tool calls of the plain reply, checked equal to the streamed reply's."""
    async def run():
        plain = await service.chats.answer(parse_chat_request(body))
        chunks = [c async for c in service.chats.stream(parse_chat_request({**body, "stream": True}))]
        return plain, chunks

    plain, chunks = asyncio.run(run())
    calls = plain["choices"][0]["message"].get("tool_calls") or []
    streamed: dict[int, dict] = {}
    for chunk in chunks:
        for delta_call in (ch["delta"].get("tool_calls") or [] for ch in chunk["choices"]):
            for part in delta_call:
                if part.get("type") == "custom":  # a custom call opens, then its input streams in pieces
                    streamed[part["index"]] = {"type": "custom", "custom": dict(part["custom"])}
                elif "custom" in part:
                    streamed[part["index"]]["custom"]["input"] += part["custom"]["input"]
                elif "id" in part:
                    streamed[part["index"]] = {"type": "function", "function": dict(part["function"])}
                else:
                    streamed[part["index"]]["function"]["arguments"] += part["function"]["arguments"]
    assert [streamed[i] for i in sorted(streamed)] == [{k: v for k, v in c.items() if k != "id"} for c in calls]
    return calls


@pytest.mark.parametrize("choice", ["words", "call", "note", "required", "allowed"])
def test_custom_tool_calls_follow_their_grammar(services, choice):
    """A custom tool's input matches its regex / parses with its Lark grammar, streamed == not streamed, under a
    named custom choice, `required` and `allowed_tools` with function and custom tools mixed."""
    tool_choice = {"required": "required", "allowed": {"type": "allowed_tools", "allowed_tools": {
        "mode": "required", "tools": [{"type": "custom", "custom": {"name": "call"}},
                                      {"type": "function", "function": {"name": "get_weather"}}]}}}.get(
        choice, {"type": "custom", "custom": {"name": choice}})
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Use a tool."}], "max_tokens": 80,
            "temperature": 0, "tools": [*TOOLS_FOR[choice], FUNCTION], "tool_choice": tool_choice,
            "parallel_tool_calls": False}
    calls = _calls_both(services["plain"], body)
    assert len(calls) == 1, calls
    _check_call(calls[0])
    if choice in CUSTOM_TOOLS_NAMES:
        assert calls[0]["type"] == "custom" and calls[0]["custom"]["name"] == choice
    if choice in ("call", "required"):  # speculative decoding: the same calls
        drafted = _calls_both(services["speculative"], body)
        assert [{k: v for k, v in c.items() if k != "id"} for c in drafted] == \
            [{k: v for k, v in c.items() if k != "id"} for c in calls]


CUSTOM_TOOLS_NAMES = ("words", "call", "note")
TOOLS_FOR = {"words": CUSTOM_TOOLS[:1], "call": CUSTOM_TOOLS[1:2], "note": CUSTOM_TOOLS[2:], "required": CUSTOM_TOOLS[:1],
             "allowed": CUSTOM_TOOLS[1:2]}  # a tiny context (512): two tools a request


def test_custom_tools_through_the_openai_sdk(services):
    import openai

    from tests.server.conftest import Live

    with Live(services["plain"]) as live:
        client = openai.OpenAI(base_url=live.base_url + "/v1", api_key="x", max_retries=0)
        ask = dict(model=services["plain"].model_id, messages=[{"role": "user", "content": "Use a tool."}],
                   max_tokens=80, temperature=0, tools=CUSTOM_TOOLS[1:2], tool_choice={"type": "custom",
                                                                                  "custom": {"name": "call"}})
        reply = client.chat.completions.create(**ask)
        call = reply.choices[0].message.tool_calls[0]
        assert call.type == "custom" and call.custom.name == "call"
        _check_call({"type": "custom", "custom": {"name": "call", "input": call.custom.input}})
        streamed = [tc for chunk in client.chat.completions.create(**ask, stream=True)
                    for ch in chunk.choices for tc in ch.delta.tool_calls or []]
        assert streamed[0].type == "custom" and streamed[0].model_extra["custom"]["name"] == "call"
        assert {tc.index for tc in streamed} == {0}
        assert "".join(tc.model_extra["custom"]["input"] for tc in streamed) == call.custom.input
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(**{**ask, "tools": [_custom("call", "lark", "start: (")]})
        assert err.value.body["param"] == "tools[0].custom.format.grammar.definition"
        assert client.chat.completions.create(**ask).choices[0].finish_reason == "tool_calls"  # still healthy

        # the Responses API: custom tools in its flat shape, `custom_tool_call` output items, streamed and not
        tool = {"type": "custom", "name": "call", "description": "Run it.",
                "format": {"type": "grammar", "syntax": "lark", "definition": CALL_LARK}}
        weather = {"type": "function", **FUNCTION["function"]}
        rask = dict(model=services["plain"].model_id, input="Use a tool.", max_output_tokens=80, temperature=0,
                    tools=[tool, weather], tool_choice={"type": "custom", "name": "call"})
        response = client.responses.create(**rask)
        item = response.output[-1]
        assert item.type == "custom_tool_call" and item.name == "call" and item.input == call.custom.input
        events = list(client.responses.create(**rask, stream=True))
        done = [e for e in events if e.type == "response.custom_tool_call_input.done"]
        assert [e.input for e in done] == [item.input]
        assert "".join(e.delta for e in events if e.type == "response.custom_tool_call_input.delta") == item.input
        follow = client.responses.create(**{**rask, "tool_choice": "auto", "input": [
            {"role": "user", "content": "Use a tool."},
            {"type": "custom_tool_call", "call_id": item.call_id, "name": "call", "input": item.input},
            {"type": "custom_tool_call_output", "call_id": item.call_id, "output": "42"}]})
        assert follow.status in ("completed", "incomplete")
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(**{**rask, "tools": [{**tool, "format": {"type": "grammar", "syntax": "lark",
                                                                              "definition": "start: /a/i"}}]})
        assert "tools[0]" in err.value.body["param"]


def test_custom_tool_grammars_that_match_nothing_are_400s(services):
    """A custom tool whose Lark or regex grammar matches no text is refused when the request is read (a 400 naming
    its definition, Chat Completions and Responses), not at its first decode step; the server stays healthy."""
    from starlette.testclient import TestClient

    from jaxchat.server import create_app

    with TestClient(create_app(services["plain"])) as client:
        for syntax, definition in (("lark", 'start: "a" start'), ("regex", r"a{0}b[^\s\S]")):
            r = client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "x"}], "max_tokens": 4, "tools": [_custom("t", syntax, definition)]})
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["param"] == "tools[0].custom.format.grammar.definition", error
            assert "matches no text" in error["message"], error
            r = client.post("/v1/responses", json={"input": "x", "max_output_tokens": 4, "tools": [
                {"type": "custom", "name": "t", "format": {"type": "grammar", "syntax": syntax, "definition": definition}}]})
            assert r.status_code == 400 and "tools[0]" in r.json()["error"]["param"], r.text
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                                                      "tools": [_custom("t", "lark", 'start: "a" start | "b"')]})
        assert r.status_code == 200, r.text
