"""`jaxchat.api.ChatService` on a scripted engine: a prompt that tokenises to nothing is a 400, never a 500.

The engine here is a stand-in that records what reaches it; the tokenizer is a real word-level
`tokenizers` model without an unknown token, the kind of checkpoint that once answered
`/v1/completions` with a 500 ("prompt_ids is empty").
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from starlette.testclient import TestClient

from jaxchat.api import ChatService
from jaxchat.engine.types import GenerationOutput
from jaxchat.server import create_app
from tests.server.helpers import assert_error, sse_events

WORDS = {"hello": 0, "world": 1, "<eos>": 2}


def word_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=WORDS))  # no unk token: an unknown word cannot be encoded
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


class ScriptedEngine:
    """Answers every request with the token "world"; records the prompts it was given."""

    def __init__(self, template: str) -> None:
        self.tokenizer = word_tokenizer()
        self.model = SimpleNamespace(chat_template=template)
        self.prompts: list[list[int]] = []
        self.eos_token_ids = (2,)

    def stats(self) -> dict:
        return {"max_context": 64, "running": 0, "waiting": 0, "max_batch": 1, "free_slots": 1, "compile_count": 0}

    async def generate(self, request):
        self.prompts.append(list(request.prompt_ids))
        yield GenerationOutput("r", [1], "world", True, "stop", num_prompt_tokens=len(request.prompt_ids),
                               num_generated_tokens=1)

    def shutdown(self) -> None:
        pass


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
