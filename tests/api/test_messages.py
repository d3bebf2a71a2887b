"""`POST /v1/messages` (the Anthropic Messages API) on a real `ChatService` over a scripted engine.

The reader, the chat template, the parser and the event writer are the real ones; only the engine is
scripted (`tests.api.test_service.ScriptedEngine`). The official `anthropic` SDK talks to a live
uvicorn on 127.0.0.1.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from starlette.testclient import TestClient

from jaxchat.api import ChatService, Limits, RequestError, parse_messages_request
from jaxchat.api.anthropic.shapes import partial_object
from jaxchat.assets import template_path
from jaxchat.server import create_app
from tests.api.test_service import ScriptedEngine
from tests.server.conftest import API_KEY, Live

anthropic = pytest.importorskip("anthropic")

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER = {"name": "get_weather", "description": "Weather for a city", "input_schema": SCHEMA}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
HELLO = [{"role": "user", "content": "hello"}]


def hermes_service(template: str = "Qwen-Qwen2.5-7B-Instruct.jinja") -> ChatService:
    return ChatService(ScriptedEngine(template_path(template).read_text(), unknown=True), "hermes")


@pytest.fixture
def service():
    return hermes_service()


@pytest.fixture
def client(service):
    with TestClient(create_app(service, api_key=API_KEY), headers={"x-api-key": API_KEY}) as c:
        yield c


@pytest.fixture(scope="module")
def live():
    with Live(hermes_service(), api_key=API_KEY) as server:
        yield server


@pytest.fixture
def sdk(live):
    live.service.engine.reply = ("world", "stop", 2)
    return anthropic.Anthropic(base_url=live.base_url, api_key=API_KEY, max_retries=0)


def _comparable(message) -> dict:
    out = message.model_dump(exclude={"id"})
    for block in out["content"]:
        block.pop("id", None)
    return out


# ---- the reader ------------------------------------------------------------------------------------
def test_the_reader_converts_to_the_chat_request():
    req = parse_messages_request({
        "model": "hermes", "max_tokens": 7, "system": [{"type": "text", "text": "Be brief."}],
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "text", "text": "Let me look."},
                                              {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                               "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                         {"type": "text", "text": "thanks"}]},
        ],
        "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
        "stop_sequences": ["END"], "temperature": 0.5, "top_k": 5, "metadata": {"user_id": "u"}, "stream": True,
    }, Limits(), 1024)
    roles = [m["role"] for m in req.messages]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert req.messages[2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert req.messages[3] == {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}
    c = req.constraint
    assert (c.tool_choice, c.named_tool, c.parallel_tool_calls, c.allow_reasoning) == (
        "required", "get_weather", False, False)
    assert c.tools[0]["function"]["parameters"] == SCHEMA
    s = req.sampling
    assert (s.max_tokens, s.stop, s.temperature, s.top_k, req.stream) == (7, ("END",), 0.5, 5, True)
    thinking = parse_messages_request({"max_tokens": 9, "messages": HELLO,
                                       "thinking": {"type": "enabled", "budget_tokens": 4}})
    assert thinking.constraint.allow_reasoning


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": HELLO}, "max_tokens"),
    ({"max_tokens": 0, "messages": HELLO}, "max_tokens"),
    ({"max_tokens": 5000, "messages": HELLO}, "max_tokens"),
    ({"max_tokens": 5, "messages": []}, "messages"),
    ({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, "messages[0].content[0].type"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"max_tokens": 5, "messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]}]}, "messages[0].content[0].input"),
    ({"max_tokens": 5, "messages": HELLO, "system": 3}, "system"),
    ({"max_tokens": 5, "messages": HELLO, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"max_tokens": 5, "messages": HELLO, "tools": [{"name": "bad name", "input_schema": SCHEMA}]}, "tools[0].name"),
    ({"max_tokens": 5, "messages": HELLO, "tools": [{"name": "f", "input_schema": {"type": 3}}]},
     "tools[0].input_schema"),
    ({"max_tokens": 5, "messages": HELLO, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
     "tool_choice.name"),
    ({"max_tokens": 5, "messages": HELLO, "tool_choice": {"type": "any"}}, "tool_choice"),
    ({"max_tokens": 5, "messages": HELLO, "tool_choice": {"type": "required"}}, "tool_choice.type"),
    ({"max_tokens": 5, "messages": HELLO, "thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"max_tokens": 5, "messages": HELLO, "temperature": 1.5}, "temperature"),
    ({"max_tokens": 5, "messages": HELLO, "stop_sequences": ["a", ""]}, "stop_sequences[1]"),
    ({"max_tokens": 5, "messages": HELLO, "stream": "yes"}, "stream"),
])
def test_every_400_names_the_anthropic_field(body, param):
    with pytest.raises(RequestError) as info:
        parse_messages_request(body, Limits(), 1024)
    assert info.value.param == param, info.value.message


def test_partial_arguments_close_where_they_stop():
    assert partial_object('{"city": "Pa') == {"city": "Pa"}
    assert partial_object('{"ci') == {"ci": None}
    assert partial_object('{"a": 1, ') == {"a": 1}
    assert partial_object('{"a": [1, {"b": "x\\"') == {"a": [1, {"b": 'x"'}]}
    assert partial_object("") == {}


# ---- the route -------------------------------------------------------------------------------------
def test_errors_are_anthropic_shaped(client):
    r = client.post("/v1/messages", json={"messages": HELLO})
    assert r.status_code == 400
    assert r.json() == {"type": "error", "error": {"type": "invalid_request_error",
                                                   "message": r.json()["error"]["message"]}}
    assert r.json()["error"]["message"].startswith("max_tokens: ")
    assert client.post("/v1/messages", json={"model": "other", "max_tokens": 5, "messages": HELLO}
                       ).json()["error"]["type"] == "not_found_error"
    r = client.post("/v1/messages", json={"max_tokens": 5, "messages": HELLO}, headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_a_cut_call_is_max_tokens_in_both_modes(client, service):
    service.engine.reply = ('Sure. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa', "length", None)
    body = {"max_tokens": 5, "messages": HELLO, "tools": [WEATHER]}
    plain = client.post("/v1/messages", json=body).json()
    assert plain["stop_reason"] == "max_tokens"
    assert [b["type"] for b in plain["content"]] == ["text", "tool_use"]
    assert plain["content"][1]["input"] == {"city": "Pa"}
    events = [json.loads(line[6:]) for line in client.post("/v1/messages", json={**body, "stream": True}).text.splitlines()
              if line.startswith("data: ")]
    assert [e["type"] for e in events][-2:] == ["message_delta", "message_stop"]
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"
    parts = "".join(e["delta"].get("partial_json", "") for e in events if e["type"] == "content_block_delta")
    assert parts == '{"city": "Pa'


def test_stop_sequence_and_thinking_blocks():
    service = hermes_service("Qwen-Qwen3-0.6B.jinja")
    service.engine.reply = ("<think>\nhmm\n</think>\n\nhello", "stop", "END")
    with TestClient(create_app(service)) as client:
        body = {"max_tokens": 9, "messages": HELLO, "stop_sequences": ["END"],
                "thinking": {"type": "enabled", "budget_tokens": 1024}}
        plain = client.post("/v1/messages", json=body).json()
    assert [b["type"] for b in plain["content"]] == ["thinking", "text"]
    assert plain["content"][0]["thinking"].strip() == "hmm" and plain["content"][1]["text"] == "hello"
    assert (plain["stop_reason"], plain["stop_sequence"]) == ("stop_sequence", "END")


# ---- the official SDK against a live server --------------------------------------------------------
def test_sdk_text(sdk):
    message = sdk.messages.create(model="hermes", max_tokens=16, messages=HELLO)
    assert message.type == "message" and message.role == "assistant"
    assert [b.text for b in message.content] == ["world"] and message.stop_reason == "end_turn"
    assert message.usage.input_tokens > 0 and message.usage.output_tokens == 1
    with sdk.messages.stream(model="hermes", max_tokens=16, messages=HELLO, extra_body={"temperature": 0}) as stream:
        assert _comparable(stream.get_final_message()) == _comparable(message)  # sampling fields as extra_body


def test_sdk_tool_use_and_tool_result_round_trip(sdk, live):
    live.service.engine.reply = (CALL, "stop", 2)
    first = sdk.messages.create(model="hermes", max_tokens=32, messages=HELLO, tools=[WEATHER],
                                tool_choice={"type": "any"})
    assert first.stop_reason == "tool_use"
    (call,) = first.content
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, SCHEMA)
    live.service.engine.reply = ("world", "stop", 2)
    messages = [*HELLO, {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]}]
    second = sdk.messages.create(model="hermes", max_tokens=32, messages=messages, tools=[WEATHER])
    assert second.stop_reason == "end_turn" and second.content[0].text == "world"
    rendered = live.service.template.render(list(parse_messages_request(
        {"max_tokens": 5, "messages": messages, "tools": [WEATHER]}).messages), tools=[{"type": "function", "function": {
            "name": "get_weather", "parameters": SCHEMA}}], add_generation_prompt=True)
    assert "<tool_response>\nsunny\n</tool_response>" in rendered and '"city": "Paris"' in rendered


@pytest.mark.parametrize("reply", [("world", "stop", 2), ("Sure. " + CALL, "stop", 2)])
def test_sdk_stream_final_message_equals_the_plain_one(sdk, live, reply):
    live.service.engine.reply = reply
    kwargs = {"model": "hermes", "max_tokens": 32, "messages": HELLO, "tools": [WEATHER]}
    plain = sdk.messages.create(**kwargs)
    with sdk.messages.stream(**kwargs) as stream:
        final = stream.get_final_message()
    assert _comparable(final) == _comparable(plain)


def test_sdk_errors_and_auth(sdk, live):
    with pytest.raises(anthropic.BadRequestError) as info:
        sdk.messages.create(model="hermes", max_tokens=16, messages=[])
    assert info.value.body["error"]["type"] == "invalid_request_error"
    bad = anthropic.Anthropic(base_url=live.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="hermes", max_tokens=16, messages=HELLO)
    bearer = anthropic.Anthropic(base_url=live.base_url, auth_token=API_KEY, max_retries=0)  # Authorization: Bearer
    assert bearer.messages.create(model="hermes", max_tokens=16, messages=HELLO).content[0].text == "world"


# ---- fuzz: random bodies are 4xx (or a valid 200), never 5xx --------------------------------------
KEYS = ["type", "text", "name", "input", "id", "content", "role", "tool_use_id", "input_schema", "budget_tokens"]
WORDS = ["user", "assistant", "tool_use", "text", "tool_result", "any", "enabled", "", "get_weather"]


def _value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(7 if depth < 3 else 5)
    if kind == 5:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    if kind == 6:
        return {rng.choice(KEYS): _value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return [None, True, rng.randint(-5, 10**6), rng.random() * 3, rng.choice(WORDS)][kind]


def test_fuzzed_bodies_are_never_5xx(client):
    rng = random.Random(16)
    fields = ["model", "max_tokens", "messages", "system", "tools", "tool_choice", "thinking", "stop_sequences",
              "temperature", "top_p", "top_k", "stream", "metadata"]
    statuses = []
    for _ in range(300):
        body = {"max_tokens": 4, "messages": HELLO} if rng.random() < 0.5 else {}
        for field in rng.sample(fields, rng.randrange(1, 5)):
            body[field] = _value(rng)
        r = client.post("/v1/messages", json=body)
        statuses.append(r.status_code)
        assert r.status_code < 500, (body, r.text)
        if r.status_code >= 400:
            assert r.json()["type"] == "error", r.text
    assert statuses.count(400) > 200
