"""`/v1/responses` with the official `openai` SDK against a live server: a real ChatService over a scripted engine.

The engine answers with a scripted text (streamed in pieces), so the real reader, template (Qwen3's, which
has tool calls and `<think>` reasoning), parser, Responses writer, SSE framing and the SDK all run.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import httpx
import jsonschema
import openai
import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from jaxchat.api import ChatService
from jaxchat.engine.types import EngineStats, GenerationOutput
from jaxchat.server import create_app
from tests.server.conftest import Live

TOOL = {"type": "function", "name": "get_weather", "strict": True, "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": False}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


class Engine:
    """Answers every request with `reply` = (text, finish reason), in pieces of 5 characters."""

    def __init__(self) -> None:
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        from jaxchat.assets import template_path

        vocab = {w: i for i, w in enumerate(["hello", "<eos>", "[UNK]", "<think>", "</think>", "<tool_call>",
                                             "</tool_call>", "<|im_end|>"])}
        tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        self.tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
        self.model = SimpleNamespace(chat_template=template_path("Qwen-Qwen3-0.6B.jinja").read_text())
        self.eos_token_ids = (1,)
        self.reply = ("Hello there", "stop")

    max_context = 8192

    def stats(self) -> EngineStats:
        return EngineStats(max_context=8192, max_batch=1, free_slots=1)

    async def generate(self, request):
        text, finish = self.reply
        pieces = [text[i:i + 5] for i in range(0, len(text), 5)] or [""]
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            yield GenerationOutput("r", [0], piece, last, finish if last else None, 1 if last else None,
                                   num_prompt_tokens=len(request.prompt_ids), num_generated_tokens=i + 1)

    def expect_request(self) -> None:  # gathers no bursts
        return None

    def prompt_fits(self, tokens: int) -> bool:
        return True

    def shutdown(self) -> None:
        pass


@pytest.fixture(scope="module")
def engine():
    return Engine()


@pytest.fixture(scope="module")
def live(engine):
    service = ChatService(engine, "scripted")
    assert service.spec.kind == "hermes_json" and service.spec.reasoning
    with Live(service) as server:
        yield server


@pytest.fixture(scope="module")
def sdk(live):
    return openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="unused", max_retries=0, timeout=10)


def _items(response) -> list[dict]:
    """The output without the per-response ids and the stream helper's `parsed` fields, to compare two responses."""
    drop = {"id", "call_id", "parsed", "parsed_arguments"}

    def clean(value):
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k not in drop}
        return [clean(v) for v in value] if isinstance(value, list) else value

    return [clean(item.model_dump()) for item in response.output]


def test_create_with_text_and_reasoning(sdk, engine):
    engine.reply = ("<think>\nThe user greets.\n</think>\n\nHello there", "stop")
    r = sdk.responses.create(model="scripted", input="hello", instructions="Be brief.")
    assert r.status == "completed" and r.output_text == "Hello there"
    assert [item.type for item in r.output] == ["reasoning", "message"]
    assert r.output[0].summary[0].text == "The user greets."
    assert r.usage.output_tokens == -(-len(engine.reply[0]) // 5) and r.usage.output_tokens_details.reasoning_tokens > 0
    assert r.usage.input_tokens > 0 and r.instructions == "Be brief."


def test_required_tool_then_its_output(sdk, engine):
    engine.reply = (CALL, "stop")
    r = sdk.responses.create(model="scripted", input="weather in Paris?", tools=[TOOL], tool_choice="required")
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), TOOL["parameters"])
    engine.reply = ("It is sunny in Paris.", "stop")
    history = [{"role": "user", "content": "weather in Paris?"}, *r.output,
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    r2 = sdk.responses.create(model="scripted", input=history, tools=[TOOL])
    assert r2.output_text == "It is sunny in Paris."


def test_parse_with_a_pydantic_format(sdk, engine):
    class City(pydantic.BaseModel):
        name: str
        population: int

    engine.reply = ('{"name": "Paris", "population": 2100000}', "stop")
    r = sdk.responses.parse(model="scripted", input="a city", text_format=City)
    assert r.output_parsed == City(name="Paris", population=2100000)


def test_stream_collects_the_plain_response(sdk, engine):
    engine.reply = ("<think>\nplan\n</think>\n\nSure. " + CALL, "stop")
    plain = sdk.responses.create(model="scripted", input="weather?", tools=[TOOL])
    with sdk.responses.stream(model="scripted", input="weather?", tools=[TOOL]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert _items(final) == _items(plain) and [i.type for i in plain.output] == ["reasoning", "message", "function_call"]
    assert final.usage == plain.usage and final.status == "completed"
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed"
    for kind in ("response.reasoning_summary_text.delta", "response.content_part.added", "response.output_text.delta",
                 "response.output_text.done", "response.function_call_arguments.delta",
                 "response.function_call_arguments.done", "response.output_item.done"):
        assert kind in kinds, kind


def test_sse_frames_name_their_events(live, engine):
    engine.reply = ("Hello there", "stop")
    r = httpx.post(f"{live.base_url}/v1/responses", json={"input": "hi", "stream": True}, timeout=10)
    blocks = [b for b in r.text.split("\n\n") if b.strip() and b != "data: [DONE]"]
    seqs = []
    for block in blocks:
        event, data = block.split("\n")
        payload = json.loads(data.removeprefix("data: "))
        assert event == f"event: {payload['type']}"
        seqs.append(payload["sequence_number"])
    assert seqs == list(range(len(seqs)))


def test_cut_output_is_incomplete(sdk, live, engine):
    engine.reply = ("Hello there, a long", "length")
    r = sdk.responses.create(model="scripted", input="hi", max_output_tokens=4)
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete" and r.output_text == "Hello there, a long"
    events = list(sdk.responses.create(model="scripted", input="hi", max_output_tokens=4, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize(("fields", "param"), [({"previous_response_id": "resp_1"}, "previous_response_id"),
                                               ({"store": True}, "store")])
def test_stateless_fields_are_400s(sdk, fields, param):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.responses.create(model="scripted", input="hi", **fields)
    assert info.value.param == param and info.value.status_code == 400


# ---- fuzz: random shapes in every field, and random bodies: always 4xx or 200, never 5xx --------------------
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40),
                     st.floats(allow_nan=False, allow_infinity=False),  # JSON has neither
                     st.text(max_size=8), st.sampled_from(["function", "message", "function_call", "user",
                                                          "function_call_output", "json_schema", "none"]))
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.sampled_from(["type", "role", "content", "name", "call_id", "arguments",
                                                          "output", "text", "schema", "format", "effort", "mode",
                                                          "tools", "parameters", "summary"]), inner, max_size=4),
                       max_leaves=10)
_fields = ["input", "instructions", "tools", "tool_choice", "text", "reasoning", "max_output_tokens",
           "temperature", "top_p", "parallel_tool_calls", "store", "stream", "model"]


@pytest.fixture(scope="module")
def client(engine):
    with TestClient(create_app(ChatService(engine, "scripted")), raise_server_exceptions=False) as c:
        yield c


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=st.one_of(_values, st.dictionaries(st.sampled_from(_fields), _values, max_size=5),
                      st.fixed_dictionaries({"input": st.lists(_values, min_size=1, max_size=3)},
                                            optional={"tools": _values, "tool_choice": _values, "text": _values})))
def test_fuzzed_bodies_are_never_5xx(client, engine, body):
    engine.reply = ("Hello", "stop")
    r = client.post("/v1/responses", json=body)
    assert r.status_code < 500, (body, r.text)
    if r.status_code != 200:
        assert set(r.json()) == {"error"}
