"""`jaxchat.api.request`: a body is read once, into a typed request; `Limits` is the one place a bound lives."""

from __future__ import annotations

import dataclasses

import pytest
from starlette.testclient import TestClient

import jaxchat.api.request as api_request
import jaxchat.chat
import jaxchat.chat.request
from jaxchat.api import ChatRequest, Limits, parse_chat_request
from jaxchat.chat import RequestError
from jaxchat.llm import LLM
from jaxchat.server import create_app
from tests.server.fake import FakeService
from tests.server.helpers import WEATHER_TOOL, chat, sse_events

TOOLS_129 = [{"type": "function", "function": {"name": f"tool_{i}"}} for i in range(129)]


@pytest.fixture
def constraint_reads(monkeypatch) -> list[dict]:
    """Every call of the constraint reader, wherever it is called from."""
    real = jaxchat.chat.request.chat_constraint_request_from_openai
    calls: list[dict] = []

    def counted(body, **kwargs):
        calls.append(body)
        return real(body, **kwargs)

    for module in (api_request, jaxchat.chat, jaxchat.chat.request):
        monkeypatch.setattr(module, "chat_constraint_request_from_openai", counted)
    return calls


def test_a_body_is_read_once_through_the_server(constraint_reads):
    service = FakeService()
    with TestClient(create_app(service)) as client:
        body = chat(tools=[WEATHER_TOOL], tool_choice="required")
        assert client.post("/v1/chat/completions", json=body).status_code == 200
        assert len(constraint_reads) == 1
        r = client.post("/v1/chat/completions", json={**body, "stream": True})
        assert r.status_code == 200 and sse_events(r.text)[-1] == "[DONE]"
        assert len(constraint_reads) == 2
    assert [type(r) for r in service.requests] == [ChatRequest, ChatRequest]
    assert service.requests[0].constraint.tool_choice == "required"


def test_a_body_is_read_once_through_llm(constraint_reads):
    llm = LLM.from_service(FakeService())
    try:
        reply = llm.chat([{"role": "user", "content": "hi"}], tools=[WEATHER_TOOL], tool_choice="required")
        assert reply["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
        assert len(constraint_reads) == 1
        chunks = list(llm.chat([{"role": "user", "content": "hi"}], stream=True))
        assert chunks and len(constraint_reads) == 2
    finally:
        llm.close()


def test_limits_admit_129_tools_through_the_server():
    body = chat(tools=TOOLS_129, tool_choice="required")
    with TestClient(create_app(FakeService())) as client:
        refused = client.post("/v1/chat/completions", json=body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools"
        assert "at most 128 tools" in refused.json()["error"]["message"]
    with TestClient(create_app(FakeService(), limits=Limits(max_tools=500))) as client:
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "tool_0"


def test_limits_admit_129_tools_through_llm():
    messages = [{"role": "user", "content": "hi"}]
    llm = LLM.from_service(FakeService())
    try:
        with pytest.raises(RequestError, match="at most 128 tools") as info:
            llm.chat(messages, tools=TOOLS_129)
        assert info.value.param == "tools"
    finally:
        llm.close()
    llm = LLM.from_service(FakeService(), limits=Limits(max_tools=500))
    try:
        reply = llm.chat(messages, tools=TOOLS_129, tool_choice="required")
        assert reply["choices"][0]["message"]["tool_calls"]
    finally:
        llm.close()


def test_schema_depth_bound_comes_from_limits():
    schema: dict = {"type": "string"}
    for _ in range(10):  # 21 containers
        schema = {"type": "object", "properties": {"x": schema}}
    body = chat(tools=[{"type": "function", "function": {"name": "f", "parameters": schema}}])
    parse_chat_request(body)
    with pytest.raises(RequestError, match="more than 20 levels") as info:
        parse_chat_request(body, Limits(max_schema_depth=20))
    assert info.value.param == "tools[0].function.parameters"


def test_invalid_json_schema_is_a_400_naming_it():
    bad = {"type": "object", "properties": {"x": {"type": "strin"}}}
    with pytest.raises(RequestError, match="invalid JSON schema") as info:
        parse_chat_request(chat(tools=[{"type": "function", "function": {"name": "f", "parameters": bad}}]))
    assert info.value.param == "tools[0].function.parameters"
    fmt = {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": 5}}}
    with pytest.raises(RequestError) as info:
        parse_chat_request(chat(response_format=fmt))
    assert info.value.param == "response_format.json_schema.schema"


def test_request_values_are_frozen_and_typed():
    request = parse_chat_request(chat(n=2, stream=True, stream_options={"include_usage": True}, logprobs=True,
                                      top_logprobs=3, stop_token_ids=[7], top_k=-1, seed=5))
    assert (request.n, request.stream, request.include_usage) == (2, True, True)
    s = request.sampling
    assert (s.logprobs, s.stop_token_ids, s.top_k, s.seed, s.temperature) == (3, (7,), 0, 5, 1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.n = 3  # type: ignore[misc]


@pytest.mark.parametrize(("field", "value"), [("max_tools", 0), ("max_n", -1), ("shutdown_grace_s", -1.0)])
def test_limits_refuse_nonsense(field, value):
    with pytest.raises(ValueError, match=field):
        Limits(**{field: value})
