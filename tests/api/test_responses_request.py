"""`parse_responses_request`: the Responses body read into the chat pipeline's `ChatRequest`, every 400 named."""

from __future__ import annotations

import pytest

from jaxchat.api import Limits, RequestError, parse_responses_request

TOOL = {"type": "function", "name": "get_weather", "strict": True,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": False}}


def test_string_input_and_instructions():
    r = parse_responses_request({"input": "hi", "instructions": "be brief", "max_output_tokens": 20,
                                 "temperature": 0, "unknown_field": 1})
    assert r.chat.messages == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"})
    assert r.chat.sampling.max_tokens == 20 and r.chat.sampling.temperature == 0
    assert r.echo["instructions"] == "be brief" and r.echo["max_output_tokens"] == 20 and not r.stream


def test_items_become_chat_messages():
    items = [
        {"role": "user", "content": [{"type": "input_text", "text": "weather "}, {"type": "input_text", "text": "now"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "call it"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.",
                                                              "annotations": []}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "rain"}]},
    ]
    messages = parse_responses_request({"input": items, "tools": [TOOL]}).chat.messages
    assert messages[0] == {"role": "user", "content": "weather now"}
    assert messages[1]["role"] == "assistant" and messages[1]["content"] == "Checking."
    assert messages[1]["reasoning_content"] == "call it"
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["call_1", "call_2"]
    assert messages[1]["tool_calls"][1]["function"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    assert messages[2:] == ({"role": "tool", "tool_call_id": "call_1", "content": "sunny", "name": "get_weather"},
                            {"role": "tool", "tool_call_id": "call_2", "content": "rain", "name": "get_weather"})


def test_constraint_fields_read_by_the_chat_reader():
    r = parse_responses_request({"input": "x", "tools": [TOOL], "tool_choice": {"type": "function",
                                 "name": "get_weather"}, "parallel_tool_calls": False,
                                 "reasoning": {"effort": "none"}})
    c = r.chat.constraint
    assert c.named_tool == "get_weather" and c.tool_choice == "required" and not c.parallel_tool_calls
    assert c.tools[0]["function"]["parameters"]["required"] == ["city"] and not c.allow_reasoning
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    c = parse_responses_request({"input": "x", "text": {"format": {"type": "json_schema", "name": "A",
                                                                   "schema": schema, "strict": True}}}).chat.constraint
    assert c.response_format == "json_schema" and c.json_schema == schema
    assert parse_responses_request({"input": "x", "text": {"format": {"type": "json_object"}}}
                                   ).chat.constraint.response_format == "json_object"
    c = parse_responses_request({"input": "x", "tools": [TOOL, {**TOOL, "name": "b"}], "tool_choice": {
        "type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "b"}]}}).chat.constraint
    assert c.allowed_tools == ("b",) and c.tool_choice == "required"


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "store": True}, "store"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({}, "input"),
    ({"input": []}, "input"),
    ({"input": 3}, "input"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
    ({"input": ["x"]}, "input[0]"),
    ({"input": "x", "instructions": 3}, "instructions"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "x", "tools": [{"type": "function", "name": "bad name!"}]}, "tools[0].name"),
    ({"input": "x", "tools": [{**TOOL, "parameters": {"type": 3}}]}, "tools[0].parameters"),
    ({"input": "x", "tools": [TOOL], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
    ({"input": "x", "tool_choice": {"type": "web_search_preview"}}, "tool_choice.type"),
    ({"input": "x", "tool_choice": "required"}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "A", "schema": 3}}}, "text.format.schema"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "x", "text": 3}, "text"),
    ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "temperature": 3}, "temperature"),
    ({"input": "x", "top_p": 0}, "top_p"),
    ({"input": "x", "stream": "yes"}, "stream"),
    ({"input": "x", "model": 3}, "model"),
])
def test_bad_bodies_name_their_param(body, param):
    with pytest.raises(RequestError) as info:
        parse_responses_request(body, Limits(), 4096)
    assert info.value.param == param, info.value.message


def test_store_false_and_bounds():
    assert parse_responses_request({"input": "x", "store": False}).chat.messages[-1]["content"] == "x"
    with pytest.raises(RequestError) as info:
        parse_responses_request({"input": [{"role": "user", "content": "x"}] * 3}, Limits(max_messages=2))
    assert info.value.param == "input"
