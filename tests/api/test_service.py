"""`jaxchat.api.ChatService` on a scripted engine: the 400s that need the model, and how a reply is read.

The engine here is a stand-in that records what reaches it and answers with a scripted output; the
tokenizer is a real word-level `tokenizers` model (without an unknown token: the kind of checkpoint that
once answered `/v1/completions` with a 500, "prompt_ids is empty"; with one for the chat templates).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from jaxchat.api import ChatPipeline, ChatService, Sampling, ServingEngine
from jaxchat.engine.types import EngineStats, GenerationOutput
from jaxchat.llm import LLM
from jaxchat.server import ServingBackend, WireApi, create_app
from tests.server.helpers import assert_error, sse_events

WORDS = {"hello": 0, "world": 1, "<eos>": 2}


def word_tokenizer(unknown: bool = False):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {**WORDS, "[UNK]": len(WORDS)} if unknown else WORDS
    # without an unk token an unknown word cannot be encoded
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]" if unknown else None))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


class ScriptedEngine:
    """Answers every request with `reply` (text, finish reason, stop reason); records the prompts it got."""

    def __init__(self, template: str, unknown: bool = False) -> None:
        self.tokenizer = word_tokenizer(unknown)
        self.model = SimpleNamespace(chat_template=template)
        self.prompts: list[list[int]] = []
        self.eos_token_ids = (2,)
        self.reply: tuple[str, str, str | int | None] = ("world", "stop", 2)
        self.stopped = False
        self.max_context = 64 if not unknown else 1024

    def stats(self) -> EngineStats:
        return EngineStats(max_context=self.max_context, max_batch=1, free_slots=1)

    async def generate(self, request):
        self.prompts.append(list(request.prompt_ids))
        text, finish, stop_reason = self.reply
        yield GenerationOutput("r", [1], text, True, finish, stop_reason, num_prompt_tokens=len(request.prompt_ids),
                               num_generated_tokens=1)

    def expect_request(self) -> None:  # gathers no bursts
        return None

    def prompt_fits(self, tokens: int) -> bool:
        return True

    def shutdown(self) -> None:
        self.stopped = True


@pytest.fixture
def engine():
    # renders the last message's content alone, so blank content renders to a prompt of no tokens
    return ScriptedEngine("{{ messages[-1]['content'] }}")


@pytest.fixture
def client(engine):
    with TestClient(create_app(ChatService(engine, "words"))) as c:
        yield c


@pytest.mark.parametrize(("prompt", "says"), [("", "empty prompt"), ("   ", "empty prompt"),
                                             ("unknown words", "cannot encode")])
@pytest.mark.parametrize("stream", [False, True])
def test_completion_prompt_without_tokens_is_a_400(client, engine, prompt, says, stream):
    r = client.post("/v1/completions", json={"prompt": prompt, "stream": stream})
    err = assert_error(r, 400, "prompt", "invalid_request_error")
    assert says in err["message"]
    assert engine.prompts == []


@pytest.mark.parametrize("stream", [False, True])
def test_chat_rendering_to_no_tokens_is_a_400(client, engine, stream):
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": " "}], "stream": stream})
    err = assert_error(r, 400, "messages", "invalid_request_error")
    assert "empty prompt" in err["message"]
    assert engine.prompts == []


def test_prompts_with_tokens_reach_the_engine(client, engine):
    r = client.post("/v1/completions", json={"prompt": "hello world"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "world"
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}], "stream": True})
    assert r.status_code == 200 and sse_events(r.text)[-1] == "[DONE]"
    assert engine.prompts == [[0, 1], [0]]


# ---- how a reply is read ---------------------------------------------------------------------------
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CUT_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa'


@pytest.fixture
def hermes():
    from jaxchat.assets import template_path

    engine = ScriptedEngine(template_path("Qwen-Qwen2.5-7B-Instruct.jinja").read_text(), unknown=True)
    service = ChatService(engine, "hermes")
    assert service.spec.kind == "hermes_json"
    with TestClient(create_app(service)) as c:
        yield engine, c


def _both(client, body: dict) -> tuple[dict, dict]:
    """(the plain reply's choice, the streamed message and finish reason assembled from the chunks)."""
    plain = client.post("/v1/chat/completions", json=body)
    assert plain.status_code == 200, plain.text
    streamed = {"content": "", "tool_calls": [], "finish_reason": None}
    for chunk in sse_events(client.post("/v1/chat/completions", json={**body, "stream": True}).text)[:-1]:
        for choice in chunk["choices"]:
            streamed["content"] += choice["delta"].get("content") or ""
            for call in choice["delta"].get("tool_calls") or ():
                if call["index"] == len(streamed["tool_calls"]):
                    streamed["tool_calls"].append({"name": call["function"]["name"], "arguments": ""})
                streamed["tool_calls"][call["index"]]["arguments"] += call["function"]["arguments"]
            streamed["finish_reason"] = choice["finish_reason"] or streamed["finish_reason"]
    return plain.json()["choices"][0], streamed


@pytest.mark.parametrize(("finish", "stop_reason"), [("length", None), ("stop", "STOP")])
def test_a_cut_call_keeps_its_arguments_and_its_engine_reason(hermes, finish, stop_reason):
    engine, client = hermes
    engine.reply = ("Sure. " + CUT_CALL, finish, stop_reason)
    body = {"messages": [{"role": "user", "content": "hello"}], "tools": [WEATHER], "stop": ["STOP"]}
    choice, streamed = _both(client, body)
    message = choice["message"]
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in message["tool_calls"]]
    assert calls == streamed["tool_calls"] == [{"name": "get_weather", "arguments": '{"city": "Pa'}]
    assert message["content"] == streamed["content"] == "Sure."
    assert choice["finish_reason"] == streamed["finish_reason"] == finish  # never "tool_calls" for a cut call


def test_a_finished_call_is_tool_calls_and_required_content_is_null(hermes):
    engine, client = hermes
    engine.reply = (CUT_CALL + 'ris"}}\n</tool_call>', "stop", 2)
    body = {"messages": [{"role": "user", "content": "hello"}], "tools": [WEATHER], "tool_choice": "required"}
    choice, streamed = _both(client, body)
    assert choice["finish_reason"] == streamed["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None and streamed["content"] == ""
    assert choice["message"]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'


def test_a_cut_reply_without_tools_keeps_every_character(client, engine):
    engine.reply = ("hello world <", "length", None)
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}]})
    assert r.json()["choices"][0]["message"]["content"] == "hello world <"


def test_a_template_that_refuses_the_messages_is_a_400():
    service = ChatService(ScriptedEngine("{{ raise_exception('roles must alternate') }}"), "strict")
    with TestClient(create_app(service)) as client:
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}]})
    err = assert_error(r, 400, "messages", "invalid_request_error")
    assert "roles must alternate" in err["message"]


def test_ignore_eos_keeps_only_the_requests_stop_tokens(engine):
    pipeline = ChatService(engine, "words")
    pipeline.stop_token_ids = (9,)  # as a format's turn-end markers would be
    assert pipeline.sampling(Sampling(stop_token_ids=(5,)), 3).stop_token_ids == (5, 9)
    assert pipeline.sampling(Sampling(stop_token_ids=(5,), ignore_eos=True), 3).stop_token_ids == (5,)
    assert pipeline.sampling(Sampling(max_tokens=100), 60).max_tokens == 4  # the room the prompt leaves


def test_completion_echo_and_streamed_choices(client, engine):
    r = client.post("/v1/completions", json={"prompt": "hello", "echo": True, "n": 2})
    assert [c["text"] for c in r.json()["choices"]] == ["helloworld", "helloworld"]
    chunks = sse_events(client.post("/v1/completions", json={"prompt": "hello", "n": 2, "stream": True,
                                                              "stream_options": {"include_usage": True}}).text)
    assert sorted(c["choices"][0]["index"] for c in chunks[:-2]) == [0, 1]
    assert chunks[-2]["usage"]["completion_tokens"] == 2 and chunks[-1] == "[DONE]"


def test_llm_generate_refuses_unknown_options(engine):
    llm = LLM.from_service(ChatService(engine, "words"))
    try:
        assert llm.generate("hello", max_tokens=3, seed=1, stop=["x"]).text == "world"
        with pytest.raises(TypeError, match="max_new_tokens"):
            llm.generate("hello", max_new_tokens=3)
    finally:
        llm.close()
    assert engine.stopped


def test_the_service_is_a_pipeline_with_an_adapter_per_wire_api_and_a_serving_backend(engine):
    """`ChatService` is the pipeline plus one adapter per wire API, each a `WireApi` on that pipeline; it adds
    nothing else (no forwarding method), offers every API, and refuses an engine that is not a `ServingEngine`."""
    service = ChatService(engine, "words")
    assert ChatService.__bases__ == (ChatPipeline,)
    assert set(vars(ChatService)) - {"__module__", "__doc__", "__qualname__", "__firstlineno__",
                                     "__static_attributes__"} == {"__init__"}
    adapters = (service.chats, service.texts, service.responses, service.anthropic)
    assert isinstance(service, ServingBackend) and all(isinstance(a, WireApi) for a in adapters)
    assert isinstance(engine, ServingEngine) and {a.pipeline for a in adapters} == {service}
    assert service.engine is engine and service.max_context == 64 and service.expect_request() is None

    with pytest.raises(TypeError, match="ServingEngine"):
        ChatService(SimpleNamespace(tokenizer=engine.tokenizer, model=engine.model), "bare")
