"""Every generic validation rule: the 400 names the offending param exactly, and valid edges pass."""

from __future__ import annotations

import pytest

from jaxchat.api import Limits, parse_chat_request, parse_completion_request
from jaxchat.chat import RequestError
from tests.server.helpers import USER, WEATHER_TOOL, assert_error, chat

BAD_CHAT = [
    ({"messages": None}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"),
    ({"messages": [{"content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": 3, "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].content[0].type",
    ),
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": ["plain"]}]}, "messages[0].content[0]"),
    ({"messages": [*USER, {"role": "assistant"}]}, "messages[1].content"),
    ({"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": "x"}]}, "messages[1].tool_calls"),
    (
        {"messages": [*USER, {"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]},
        "messages[1].tool_calls[0].function.name",
    ),
    (
        {"messages": [*USER, {"role": "assistant", "tool_calls": [{"type": "code", "function": {"name": "f"}}]}]},
        "messages[1].tool_calls[0].type",
    ),
    (
        {"messages": [*USER, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 3}}]}]},
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        {"messages": [*USER, {"role": "assistant", "content": "x", "reasoning_content": 1}]},
        "messages[1].reasoning_content",
    ),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, "messages[0].tool_calls"),
    ({"messages": [{"role": "tool", "content": "x", "tool_call_id": 7}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "user", "content": "x", "name": ["n"]}]}, "messages[0].name"),
    ({"model": 42}, "model"),
    ({"stream": "yes"}, "stream"),
    ({"stream": 1}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": True}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "true"}}, "stream_options.include_usage"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"n": 1.5}, "n"),
    ({"n": True}, "n"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": -5}, "max_tokens"),
    ({"max_tokens": 10**12}, "max_tokens"),
    ({"max_tokens": "100"}, "max_tokens"),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"max_completion_tokens": 2.0}, "max_completion_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": 2.01}, "temperature"),
    ({"temperature": "hot"}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.1}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 2.5}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"min_p": -0.1}, "min_p"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": -1}, "repetition_penalty"),
    ({"seed": "42"}, "seed"),
    ({"seed": 1.0}, "seed"),
    ({"seed": 2**70}, "seed"),
    ({"logprobs": 1}, "logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": False, "top_logprobs": 3}, "top_logprobs"),
    ({"stop": 5}, "stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": ["a", 3]}, "stop[1]"),
    ({"stop": ""}, "stop"),
    ({"stop": ["ok", ""]}, "stop[1]"),
    ({"ignore_eos": "no"}, "ignore_eos"),
    ({"stop_token_ids": [1, -2]}, "stop_token_ids[1]"),
    ({"tools": "x"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER_TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"think": "no"}, "think"),
    ({"reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"parallel_tool_calls": "false"}, "parallel_tool_calls"),
]


@pytest.mark.parametrize(("fields", "param"), BAD_CHAT, ids=[p for _, p in BAD_CHAT])
def test_chat_400_names_param(client, service, fields, param):
    before = len(service.requests)
    err = assert_error(client.post("/v1/chat/completions", json=chat(**fields)), 400, param, "invalid_request_error")
    assert err["message"]
    assert len(service.requests) == before  # refused before the service saw it


BAD_COMPLETION = [
    ({}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, "a"]}, "prompt[1]"),
    ({"prompt": [1, -1]}, "prompt[1]"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": "x", "echo": "yes"}, "echo"),
    ({"prompt": "x", "logprobs": 6}, "logprobs"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "suffix": "tail"}, "suffix"),
]


@pytest.mark.parametrize(("fields", "param"), BAD_COMPLETION, ids=[p for _, p in BAD_COMPLETION])
def test_completion_400_names_param(client, fields, param):
    assert_error(client.post("/v1/completions", json=fields), 400, param)


GOOD = [
    {"temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0, "presence_penalty": -2, "frequency_penalty": 2},
    {"temperature": 2.0, "top_p": 0.01, "top_k": 0, "min_p": 1, "repetition_penalty": 1.3, "seed": -1},
    {"n": 16, "max_tokens": 4096, "logprobs": True, "top_logprobs": 20, "stop": ["a", "b", "c", "d"]},
    {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "s"}]},
            {"role": "developer", "content": "d"},
            *USER,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
        ]
    },
    {"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    {"unknown_field": {"anything": [1, 2]}, "user": "u", "seed": None, "stop": None},
    {"stream": True, "stream_options": {"include_usage": False}},
]


@pytest.mark.parametrize("fields", GOOD)
def test_valid_edges_pass(client, fields):
    r = client.post("/v1/chat/completions", json=chat(**fields))
    assert r.status_code == 200, r.text


def test_readers_are_pure_and_typed():
    body = chat(stop="x", max_tokens=5, seed=None, max_completion_tokens=None)
    before = repr(body)
    request = parse_chat_request(body)
    assert repr(body) == before  # the input is not modified
    assert request.sampling.stop == ("x",) and request.sampling.seed is None and request.sampling.max_tokens == 5
    assert parse_chat_request(chat(max_tokens=9, max_completion_tokens=7)).sampling.max_tokens == 7
    assert parse_chat_request(body) == request
    assert parse_completion_request({"prompt": ["hi"]}).prompt == "hi"
    assert parse_completion_request({"prompt": [[1, 2]]}).prompt == (1, 2)
    assert parse_completion_request({"prompt": "x"}).sampling.max_tokens == 16  # the OpenAI default
    with pytest.raises(RequestError) as info:
        parse_chat_request(chat(max_tokens=100), Limits(), max_context=50)
    assert info.value.param == "max_tokens" and "50" in info.value.message
    with pytest.raises(RequestError):
        parse_chat_request([1])


@pytest.mark.parametrize("raw", [b"1e400", b"-1e999", b"1E+309"])
def test_overflowing_numbers_are_400(client, raw):
    body = b'{"messages": [{"role": "user", "content": "x"}], "temperature": ' + raw + b"}"
    assert_error(
        client.post("/v1/chat/completions", content=body, headers={"content-type": "application/json"}),
        400,
        "temperature",
    )


def test_deep_tool_schema_names_its_param(client):
    schema: dict = {"type": "string"}
    for _ in range(34):  # 68 containers: over the schema bound (64), under the body bound (100)
        schema = {"type": "object", "properties": {"x": schema}}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    err = assert_error(client.post("/v1/chat/completions", json=chat(tools=tools)), 400, "tools[0].function.parameters")
    assert "nested too deeply" in err["message"]
