"""End to end with the default model: the README's serve command, a tool call through curl, the live checks.

Starts `jaxchat serve` (no --model: Qwen2.5-Coder-0.5B-Instruct from the asset fetcher) as a subprocess
on 127.0.0.1, waits for /health, sends a `tool_choice: "required"` request with curl and checks the
call (and one under "auto", which the model writes as a fenced JSON call), then runs every standard-library live check in `tests/live/` against it, and stops the server
with SIGTERM (it must exit 0).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.serve_process import start_serve, stop

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    try:
        from jaxchat.assets import DEFAULT_MODEL, asset_path

        asset_path(DEFAULT_MODEL)
    except Exception as exc:
        pytest.skip(f"default model not fetched: {exc}")
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    jaxchat = shutil.which("jaxchat", path=str(Path(sys.executable).parent)) or "jaxchat"  # the README's command
    # the notebooks' shapes (2 x 512): with the run's shared compilation cache one of them compiles, the others load
    # "--programs background", the users' default, though the test run's is "first" (tests/conftest.py): the 0.5B
    # runs every step in its smallest ready program, and with the first set alone (a 256-token ragged step, no
    # verify program for drafts) these tests took 254 s instead of 158 s, measured one after the other here
    proc, base = start_serve(["--max-batch", "2", "--max-context", "512", "--programs", "background"], log_path,
                             command=[jaxchat])
    yield base, proc, log_path
    stop(proc)


def test_log_names_detected_format(server):
    _, _, log_path = server
    text = log_path.read_text()
    assert "Chat format: hermes_json" in text
    assert "Grammar engine ready in" in text


def test_tool_call_through_curl(server):
    base, _, _ = server
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    body = {
        "model": "qwen2.5-coder-0.5b-instruct",
        "messages": [{"role": "user", "content": "What is the weather in Paris right now?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 64,
    }
    out = subprocess.run(
        ["curl", "-sS", "--fail-with-body", f"{base}/v1/chat/completions", "-H", "Content-Type: application/json", "-d", json.dumps(body)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    choice = json.loads(out.stdout)["choices"][0]
    calls = choice["message"]["tool_calls"]
    assert calls and calls[0]["function"]["name"] == "get_weather"
    assert isinstance(json.loads(calls[0]["function"]["arguments"])["city"], str)
    assert choice["finish_reason"] == "tool_calls"


def test_live_checks_pass(server):
    base, _, _ = server
    env = dict(os.environ)
    result = subprocess.run(
        [sys.executable, str(ROOT / "tests/live/run_all.py"), "--base-url", base, "--model", "qwen2.5-coder-0.5b-instruct",
         "--max-tokens", "128", "--timeout", "600", "--concurrency", "2"],  # two at a time: the --max-batch
        capture_output=True, text=True, timeout=1800, env=env,
    )
    print(result.stdout[-4000:])
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


MODEL = "qwen2.5-coder-0.5b-instruct"
STRICT_TOOL = {
    "type": "function",
    "function": {
        "name": "book_table",
        "strict": True,
        "description": "Book a restaurant table",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"people": {"type": "integer", "minimum": 1, "maximum": 12}, "time": {"type": "string", "enum": ["18:00", "20:00"]}},
            "required": ["people", "time"],
        },
    },
}
ASK = [{"role": "user", "content": "Book a table for 4 people at 8pm, and tell me the weather in Paris."}]


def test_openai_sdk_sync_against_real_model(server):
    import jsonschema
    import openai
    from pydantic import BaseModel

    base, _, _ = server
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
    plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0)
    assert plain.choices[0].message.content and plain.usage.completion_tokens <= 8
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8, temperature=0, stream=True) if c.choices]
    assert "".join(pieces) == plain.choices[0].message.content
    modes = {"required": None, "named": {"type": "function", "function": {"name": "book_table"}}, "none": "none", "auto": "auto"}
    for mode, choice in modes.items():
        reply = client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER, STRICT_TOOL], max_tokens=64, temperature=0,
                                               tool_choice=choice or "required")
        calls = reply.choices[0].message.tool_calls or []
        if mode == "none":
            assert not calls
        if mode in ("required", "named"):
            assert calls, mode
        if mode == "named":
            assert {c.function.name for c in calls} == {"book_table"}
        for call in calls:
            if call.function.name == "book_table":  # strict: schema-valid arguments
                jsonschema.validate(json.loads(call.function.arguments), STRICT_TOOL["function"]["parameters"])
    with client.chat.completions.stream(model=MODEL, messages=ASK, tools=[WEATHER, STRICT_TOOL], tool_choice="required",
                                        max_tokens=64, temperature=0) as stream:
        final = stream.get_final_completion()
    calls = final.choices[0].message.tool_calls
    assert calls and all(isinstance(json.loads(c.function.arguments), dict) for c in calls)

    class City(BaseModel):
        name: str
        country: str

    parsed = client.chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "Give a city as JSON."}],
                                           response_format=City, max_tokens=48, temperature=0)
    assert isinstance(parsed.choices[0].message.parsed, City)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
    assert err.value.body["param"] == "tool_choice.function.name"


def test_openai_sdk_async_against_real_model(server):
    import asyncio

    import openai

    base, _, _ = server

    async def run():
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
        reply = await client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=48, temperature=0)
        stream = await client.chat.completions.create(model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", max_tokens=48,
                                                      temperature=0, stream=True)
        names = [tc.function.name async for c in stream if c.choices for tc in (c.choices[0].delta.tool_calls or []) if tc.function and tc.function.name]
        return reply, names

    reply, names = asyncio.run(run())
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == names


def test_openai_responses_api_against_real_model(server):
    """`/v1/responses` with the SDK: text, a required tool and its output, parse, stream == plain, a 400."""
    import jsonschema
    import openai
    from pydantic import BaseModel

    base, _, _ = server
    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=600)
    text = client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=16, temperature=0)
    assert text.output_text and text.usage.output_tokens <= 16
    tool = {"type": "function", "name": "book_table", "strict": True, "description": "Book a restaurant table",
            "parameters": STRICT_TOOL["function"]["parameters"]}
    ask = [{"role": "user", "content": ASK[0]["content"]}]
    # one call: with jump-forward this model writes a second call that 64 tokens cut (the stream then ends
    # `response.incomplete`, not `response.completed`)
    call_args = dict(model=MODEL, input=ask, tools=[tool], tool_choice="required", parallel_tool_calls=False,
                     max_output_tokens=64, temperature=0)
    called = client.responses.create(**call_args)
    calls = [item for item in called.output if item.type == "function_call"]
    assert calls and calls[0].name == "book_table" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), tool["parameters"])
    with client.responses.stream(**call_args) as stream:
        final = stream.get_final_response()
    assert [(i.type, i.name, i.arguments) for i in final.output] == [(i.type, i.name, i.arguments) for i in called.output]
    history = [*ask, *called.output, *({"type": "function_call_output", "call_id": c.call_id, "output": "booked"}
                                       for c in calls)]
    answer = client.responses.create(model=MODEL, input=history, tools=[tool], max_output_tokens=32, temperature=0)
    # The reply to the tool's output: text, or (as this model does at temperature 0) the call again, written as
    # bare JSON. Since call envelopes (issue 36) that is a function_call, no longer text.
    again = [item for item in answer.output if item.type == "function_call"]
    assert answer.output_text or (again and again[0].name == "book_table")
    for item in again:
        jsonschema.validate(json.loads(item.arguments), tool["parameters"])

    class City(BaseModel):
        name: str
        country: str

    parsed = client.responses.parse(model=MODEL, input="Give a city as JSON.", text_format=City, max_output_tokens=48,
                                    temperature=0)
    assert isinstance(parsed.output_parsed, City)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="hi", previous_response_id="resp_1")
    assert err.value.body["param"] == "previous_response_id"


def test_anthropic_sdk_against_real_model(server):
    import anthropic
    import jsonschema

    base, _, _ = server
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=600)
    hello = [{"role": "user", "content": "Say hello."}]
    greedy = {"temperature": 0}  # the anthropic SDK (2.x) has no temperature argument
    plain = client.messages.create(model=MODEL, max_tokens=8, messages=hello, extra_body=greedy)
    assert plain.content[0].type == "text" and plain.content[0].text and plain.usage.output_tokens <= 8
    with client.messages.stream(model=MODEL, max_tokens=8, messages=hello, extra_body=greedy) as stream:
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in plain.content]
    assert final.stop_reason == plain.stop_reason
    tool = {"name": "get_weather", "description": WEATHER["function"]["description"],
            "input_schema": WEATHER["function"]["parameters"]}
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.messages.create(model=MODEL, max_tokens=64, messages=ask, tools=[tool], tool_choice={"type": "any"},
                                   extra_body=greedy)
    calls = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and calls and calls[0].name == "get_weather"
    jsonschema.validate(calls[0].input, tool["input_schema"])
    results = [{"type": "tool_result", "tool_use_id": c.id, "content": "Sunny, 21 C"} for c in calls]
    second = client.messages.create(model=MODEL, max_tokens=32, extra_body=greedy, tools=[tool], messages=[
        *ask, {"role": "assistant", "content": [b.model_dump() for b in first.content]}, {"role": "user", "content": results}])
    assert second.content and second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=MODEL, max_tokens=8, messages=ask, tools=[tool], tool_choice={"type": "tool", "name": "nope"})
    assert err.value.body["type"] == "error" and err.value.body["error"]["message"].startswith("tool_choice.name")


TRIANGLE = {"type": "function", "function": {
    "name": "calculate_triangle_area",
    "description": "Calculate the area of a triangle given its base and height. Note that the provided function is in "
                   "Python 3 syntax.",
    "parameters": {"type": "object", "properties": {
        "base": {"type": "integer", "description": "The base of the triangle."},
        "height": {"type": "integer", "description": "The height of the triangle."},
        "unit": {"type": "string", "description": "The unit of measure (defaults to 'units' if not specified)"}},
        "required": ["base", "height"]}}}


def test_fenced_call_under_auto_is_a_tool_call(server):
    """BFCL v4 simple_python_0 (bench/function_calling.py): under tool_choice auto the model writes its call as
    a ```json fence, not `<tool_call>`; it comes back as the tool call, streamed and not alike."""
    import openai

    base, _, _ = server
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="none")
    request = {"model": "qwen2.5-coder-0.5b-instruct", "tools": [TRIANGLE], "temperature": 0, "max_tokens": 96,
               "messages": [{"role": "user", "content": "Find the area of a triangle with a base of 10 units and "
                                                        "height of 5 units."}]}
    reply = client.chat.completions.create(**request)
    message = reply.choices[0].message
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()]
    assert len(calls) == 1 and calls[0][0] == "calculate_triangle_area", (message.content, calls)
    assert {k: calls[0][1][k] for k in ("base", "height")} == {"base": 10, "height": 5}
    assert reply.choices[0].finish_reason == "tool_calls" and "```" not in (message.content or "")
    streamed = {"content": "", "name": "", "arguments": ""}
    for chunk in client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            streamed["content"] += choice.delta.content or ""
            for call in choice.delta.tool_calls or ():
                streamed["name"] += call.function.name or ""
                streamed["arguments"] += call.function.arguments or ""
    assert streamed == {"content": message.content or "", "name": "calculate_triangle_area",
                        "arguments": message.tool_calls[0].function.arguments}


def test_sigterm_exits_cleanly(server):
    _, proc, log_path = server
    assert stop(proc) == 0, log_path.read_text()[-3000:]
