"""Route contract, error bodies, auth, body limits and metrics, on the in-process transport."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from jaxchat.api import ChatRequest, Limits
from jaxchat.server import ServingBackend, WireApi, create_app
from tests.server.conftest import API_KEY
from tests.server.fake import FakeService
from tests.server.helpers import WEATHER_TOOL, assert_error, chat, sse_events


def test_chat_completion_contract(client):
    r = client.post("/v1/chat/completions", json=chat())
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "fake-model"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]


def test_service_receives_typed_request(client, service):
    r = client.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "x"}], "stop": "END", "max_completion_tokens": 7, "seed": None},
    )
    assert r.status_code == 200
    request = service.requests[-1]
    assert isinstance(request, ChatRequest) and request.sampling.stop == ("END",)
    assert request.sampling.max_tokens == 7 and request.sampling.seed is None


def test_stream_contract_and_usage(client, service):
    r = client.post("/v1/chat/completions", json=chat(stream=True, stream_options={"include_usage": True}))
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream") and r.headers["cache-control"] == "no-cache"
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert all(c["usage"] is None for c in chunks[:-1])
    roles = [c["choices"][0]["delta"].get("role") for c in chunks[:-1]]
    assert roles.count("assistant") == 1
    assert service.requests[-1].include_usage is True


def test_stream_without_usage_hides_usage(client, service):
    r = client.post("/v1/chat/completions", json=chat(stream=True))
    chunks = sse_events(r.text)[:-1]
    assert all("usage" not in c for c in chunks) and all(c["choices"] for c in chunks)
    assert service.requests[-1].include_usage is False  # the stream's usage still reaches the metrics
    metrics = client.get("/metrics").text
    assert "jaxchat_completion_tokens_total" in metrics and "jaxchat_completion_tokens_total 0.0" not in metrics


def test_tool_call_stream(client):
    r = client.post("/v1/chat/completions", json=chat(tools=[WEATHER_TOOL], tool_choice="required", stream=True))
    chunks = sse_events(r.text)[:-1]
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls", [])]
    assert calls[0]["id"] and calls[0]["function"]["name"] == "get_weather"
    assert all("index" in tc for tc in calls) and sum("id" in tc for tc in calls) == 1
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_completions_models_health(client):
    r = client.post("/v1/completions", json={"model": "fake-model", "prompt": "Once", "max_tokens": 3})
    assert r.status_code == 200 and r.json()["object"] == "text_completion"
    assert r.json()["choices"][0]["finish_reason"] == "length"
    r = client.post("/v1/completions", json={"prompt": [1, 2, 3], "stream": True})
    events = sse_events(r.text)
    assert events[-1] == "[DONE]" and events[0]["choices"][0]["text"]
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "fake-model"
    assert client.get("/health").json() == {"status": "ok"}


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/v1/nothing", 404), ("GET", "/v1/chat/completions", 405), ("DELETE", "/v1/models", 405)],
)
def test_unknown_routes_and_methods(client, method, path, status):
    assert_error(client.request(method, path), status, None, "invalid_request_error")


@pytest.mark.parametrize(
    ("content", "headers", "fragment"),
    [
        (b"{not json", {"content-type": "application/json"}, "not valid JSON"),
        (b'{"messages": [', {"content-type": "application/json"}, "not valid JSON"),
        (b"", {"content-type": "application/json"}, "empty"),
        (b"[1, 2]", {"content-type": "application/json"}, "must be a JSON object"),
        (b'{"messages": "\xff\xfe"}', {"content-type": "application/json"}, "UTF-8"),
        (b'{"temperature": NaN}', {"content-type": "application/json"}, "not valid JSON"),
        (b'{"a": ' + b"9" * 5000 + b"}", {"content-type": "application/json"}, "not valid JSON"),
        (b'{"a": ' + b"[" * 120 + b"]" * 120 + b"}", {"content-type": "application/json"}, "nested too deeply"),
        (b"[" * 5000 + b"]" * 5000, {"content-type": "application/json"}, "nested too deeply"),
        (b"messages=hi", {"content-type": "application/x-www-form-urlencoded"}, "Content-Type"),
        (b"{}", {"content-type": "application/json; charset=latin-1"}, "Content-Type"),
    ],
)
def test_bad_bodies_are_400(client, content, headers, fragment):
    err = assert_error(client.post("/v1/chat/completions", content=content, headers=headers), 400, None)
    assert fragment in err["message"]


def test_missing_content_type_is_read_as_json(client):
    r = client.post("/v1/chat/completions", content=b'{"messages": [{"role": "user", "content": "x"}]}')
    assert r.status_code == 200


def test_body_size_limit_413(service):
    from starlette.testclient import TestClient

    with TestClient(create_app(service, limits=Limits(max_body_bytes=1000))) as c:
        err = assert_error(c.post("/v1/chat/completions", json=chat(user="x" * 2000)), 413, None)
        assert "1000 bytes" in err["message"] and err["code"] == "request_too_large"

        def chunked():
            yield b'{"messages": [{"role": "user", "content": "'
            for _ in range(20):
                yield b"y" * 100
            yield b'"}]}'

        assert_error(
            c.post("/v1/chat/completions", content=chunked(), headers={"content-type": "application/json"}), 413
        )


def test_message_and_tool_count_limits(service):
    from starlette.testclient import TestClient

    with TestClient(create_app(service, limits=Limits(max_messages=3, max_tools=2))) as c:
        msgs = [{"role": "user", "content": "x"}] * 4
        err = assert_error(c.post("/v1/chat/completions", json={"messages": msgs}), 400, "messages")
        assert "at most 3" in err["message"]
        tools = [{"type": "function", "function": {"name": f"t{i}"}} for i in range(3)]
        assert_error(c.post("/v1/chat/completions", json=chat(tools=tools)), 400, "tools")


def test_unknown_model_is_404(client):
    err = assert_error(client.post("/v1/chat/completions", json=chat(model="gpt-4o")), 404, "model")
    assert err["code"] == "model_not_found"
    assert_error(client.post("/v1/completions", json={"model": "other", "prompt": "x"}), 404, "model")


def test_service_errors(client):
    err = assert_error(
        client.post("/v1/chat/completions", json=chat(messages=[{"role": "user", "content": "REJECT"}])),
        400,
        "messages",
        "invalid_request_error",
    )
    assert "rejected" in err["message"]
    err = assert_error(
        client.post("/v1/chat/completions", json=chat(messages=[{"role": "user", "content": "BOOM"}])),
        500,
        None,
        "server_error",
    )
    assert "/secret" not in err["message"] and "Traceback" not in err["message"] and "boom" not in err["message"]
    r = client.post("/v1/chat/completions", json=chat(messages=[{"role": "user", "content": "BOOM"}], stream=True))
    assert_error(r, 500, None, "server_error")  # raised before the first chunk: a JSON error, not SSE
    r = client.post("/v1/chat/completions", json=chat(messages=[{"role": "user", "content": "REJECT"}], stream=True))
    assert_error(r, 400, "messages")


def test_error_mid_stream_is_an_error_event(client):
    r = client.post(
        "/v1/chat/completions", json=chat(messages=[{"role": "user", "content": "FAIL_MIDSTREAM"}], stream=True)
    )
    events = sse_events(r.text)
    assert events[-1] == "[DONE]" and events[-2]["error"]["type"] == "server_error"


def test_api_key(keyed_client):
    c = keyed_client
    for method, path in [
        ("GET", "/v1/models"),
        ("GET", "/metrics"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
    ]:
        err = assert_error(c.request(method, path, json=chat()), 401, None, "authentication_error")
        assert err["code"] == "invalid_api_key"
        r = c.request(method, path, json=chat(), headers={"Authorization": "Bearer wrong"})
        assert_error(r, 401, None, "authentication_error")
        assert r.headers["www-authenticate"] == "Bearer"
    assert_error(c.get("/v1/models", headers={"Authorization": API_KEY}), 401)  # no scheme
    assert_error(c.get("/v1/models", headers={"Authorization": f"Basic {API_KEY}"}), 401)
    stream = c.post("/v1/chat/completions", json=chat(stream=True), headers={"Authorization": "Bearer nope"})
    assert_error(stream, 401)
    assert c.get("/health").status_code == 200
    ok = {"Authorization": f"Bearer {API_KEY}"}
    assert c.get("/v1/models", headers=ok).status_code == 200
    r = c.post("/v1/chat/completions", json=chat(stream=True), headers=ok)
    assert sse_events(r.text)[-1] == "[DONE]"


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            if key == name or key.startswith(name + "{"):
                total += float(value)
    return total


def test_metrics_change_after_requests(client):
    before = client.get("/metrics")
    assert before.headers["content-type"].startswith("text/plain")
    b = before.text
    client.post("/v1/chat/completions", json=chat())
    client.post("/v1/chat/completions", json=chat(stream=True))
    client.post("/v1/chat/completions", json=chat(temperature=9))
    a = client.get("/metrics").text
    assert _metric(a, "jaxchat_prompt_tokens_total") > _metric(b, "jaxchat_prompt_tokens_total")
    assert _metric(a, "jaxchat_completion_tokens_total") > _metric(b, "jaxchat_completion_tokens_total")
    assert (
        _metric(a, "jaxchat_time_to_first_token_seconds_count")
        == _metric(b, "jaxchat_time_to_first_token_seconds_count") + 1
    )
    assert _metric(a, "jaxchat_time_per_output_token_seconds_count") >= 1
    assert 'jaxchat_requests_total{route="/v1/chat/completions",status="200"} 2.0' in a
    assert 'jaxchat_requests_total{route="/v1/chat/completions",status="400"} 1.0' in a
    assert "jaxchat_batch_slots_total 4.0" in a and "jaxchat_batch_occupancy 0.0" in a
    assert "jaxchat_compiles 2.0" in a and "jaxchat_requests_running 0.0" in a
    client.get("/random/path/that/is/not/a/route")
    assert 'route="other"' in client.get("/metrics").text


class _Announcing(FakeService):
    """A service that records the arrivals the server announces (`expect_request`) and whether each was closed
    by the time the service saw its request."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[list[bool]] = []  # [closed] per announced request

    def expect_request(self):
        flag = [False]
        self.arrivals.append(flag)

        class Arrival:
            def close(self) -> None:
                flag[0] = True

        return Arrival()


@pytest.mark.parametrize(("body", "status"), [
    (chat(), 200),
    (chat(stream=True), 200),
    ({"messages": "not a list"}, 400),
    (chat(model="another-model"), 404),
])
def test_every_generation_request_is_announced_and_its_arrival_closed(body, status):
    """The server announces a generation request before reading it (the engine gathers a burst by it) and
    closes the announcement however the request ends: answered, streamed, or refused."""
    service = _Announcing()
    with TestClient(create_app(service), raise_server_exceptions=False) as client:
        r = client.post("/v1/chat/completions", json=body)
        assert r.status_code == status
        assert service.arrivals == [[True]]
        assert client.get("/v1/models").status_code == 200
    assert service.arrivals == [[True]]  # other routes announce nothing


def test_an_arrival_is_closed_when_a_stream_is_refused_before_it_starts():
    """A stream the service refuses while setting it up (before any chunk) still closes its announcement: an
    idle engine must not hold its burst for a request that will never be submitted."""
    from jaxchat.server.errors import ApiError

    class Refusing(_Announcing):
        def chat_completion_stream(self, request):
            raise ApiError(400, "refused while setting up the stream")

    service = Refusing()
    with TestClient(create_app(service), raise_server_exceptions=False) as client:
        assert client.post("/v1/chat/completions", json=chat(stream=True)).status_code == 400
    assert service.arrivals == [[True]]


def test_the_backend_is_checked_with_its_protocol_and_its_missing_apis_are_404s():
    """`create_app` takes a `ServingBackend` (checked with isinstance); a backend without the Responses or
    Messages API has None for that adapter, and those routes are 404s."""
    service = FakeService()
    assert isinstance(service, ServingBackend) and service.responses is None and service.anthropic is None
    assert isinstance(service.chats, WireApi) and isinstance(service.texts, WireApi)
    with TestClient(create_app(service)) as client:
        assert_error(client.post("/v1/responses", json={"input": "hi"}), 404)
        assert client.post("/v1/messages", json={"model": "m", "max_tokens": 5,
                                                 "messages": [{"role": "user", "content": "hi"}]}).status_code == 404

    class Partial:  # the chat API alone: not a ServingBackend
        model_id, max_context = "m", 8
        chats = service.chats

        def stats(self) -> dict:
            return {}

    with pytest.raises(TypeError, match="ServingBackend"):
        create_app(Partial())
