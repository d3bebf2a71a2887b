"""The official `openai` SDK, sync and async, against the live server with the fake service."""

from __future__ import annotations

import asyncio
import json

import openai
import pydantic
import pytest

from tests.server.conftest import API_KEY
from tests.server.helpers import TIME_TOOL, WEATHER_TOOL

MSGS = [{"role": "user", "content": "What is the weather in Paris? use get_weather and get_time"}]


@pytest.fixture(scope="module")
def sdk(live):
    return openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="unused", max_retries=0, timeout=10)


def test_create_and_stream_agree(sdk):
    plain = sdk.chat.completions.create(model="fake-model", messages=MSGS, temperature=0)
    text = "".join(
        c.choices[0].delta.content or ""
        for c in sdk.chat.completions.create(model="fake-model", messages=MSGS, temperature=0, stream=True)
        if c.choices
    )
    assert plain.choices[0].message.content == text and plain.choices[0].finish_reason == "stop"
    assert plain.usage.completion_tokens > 0


def test_stream_usage_chunk(sdk):
    chunks = list(
        sdk.chat.completions.create(
            model="fake-model", messages=MSGS, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens > 0
    assert all(c.usage is None for c in chunks[:-1])


def test_bad_request_error_has_param(sdk):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="fake-model", messages=MSGS, temperature=3)
    assert info.value.param == "temperature" and info.value.status_code == 400
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="fake-model", messages=MSGS, stream=True, top_logprobs=3)
    assert info.value.param == "top_logprobs"
    with pytest.raises(openai.NotFoundError) as info:
        sdk.chat.completions.create(model="nope", messages=MSGS)
    assert info.value.code == "model_not_found"


def test_stream_helper_accumulates_tool_calls(sdk):
    with sdk.chat.completions.stream(model="fake-model", messages=MSGS, tools=[WEATHER_TOOL, TIME_TOOL]) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert all(c.id for c in calls) and final.choices[0].finish_reason == "tool_calls"
    assert "tool_calls.function.arguments.done" in events


def test_named_tool_choice_and_parse(sdk):
    out = sdk.chat.completions.create(
        model="fake-model",
        messages=MSGS,
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    assert [c.function.name for c in out.choices[0].message.tool_calls] == ["get_time"]

    class City(pydantic.BaseModel):
        name: str
        population: int

    parsed = sdk.chat.completions.parse(model="fake-model", messages=MSGS, response_format=City)
    assert isinstance(parsed.choices[0].message.parsed, City)


def test_completions_and_models(sdk):
    out = sdk.completions.create(model="fake-model", prompt="Once", max_tokens=4)
    assert out.choices[0].finish_reason == "length" and out.choices[0].text
    assert [m.id for m in sdk.models.list()] == ["fake-model"]


def test_async_sdk(live):
    async def main():
        client = openai.AsyncOpenAI(base_url=f"{live.base_url}/v1", api_key="x", max_retries=0, timeout=10)
        plain, stream = await asyncio.gather(
            client.chat.completions.create(model="fake-model", messages=MSGS),
            client.chat.completions.create(model="fake-model", messages=MSGS, stream=True),
        )
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == plain.choices[0].message.content
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(model="fake-model", messages=[])
        assert info.value.param == "messages"
        await client.close()

    asyncio.run(main())


def test_sdk_with_api_key(live_keyed):
    base = f"{live_keyed.base_url}/v1"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base, api_key="wrong", max_retries=0).chat.completions.create(
            model="fake-model", messages=MSGS, stream=True
        )
    good = openai.OpenAI(base_url=base, api_key=API_KEY, max_retries=0)
    assert list(good.chat.completions.create(model="fake-model", messages=MSGS, stream=True))
