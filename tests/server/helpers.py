"""Small helpers shared by the server tests."""

from __future__ import annotations

import json

USER = [{"role": "user", "content": "hi there"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
}


def chat(**fields) -> dict:
    return {"model": "fake-model", "messages": USER, **fields}


def assert_error(response, status: int, param: str | None = "ANY", type: str | None = None) -> dict:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    if param != "ANY":
        assert err["param"] == param, err
    if type is not None:
        assert err["type"] == type, err
    return err


def sse_events(text: str) -> list:
    """The `data:` payloads of an SSE body, decoded (the literal '[DONE]' kept as a string)."""
    out = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out
