"""`ChatService`: one model's serving pipeline and its four wire APIs, for the HTTP server and `jaxchat.LLM`.

Contract: `ChatService(engine, model_id, grammar=None, chat_template=None)` builds one `ChatPipeline`
(`jaxchat.api.pipeline`: template, tokenizer, the model's one `ChatFormatSpec`, grammar, engine) and
composes the adapters that write each wire API from it: `chats` (`ChatCompletions`: `chat_completion`,
`chat_completion_stream`), `texts` (`TextCompletions`: `completion`, `completion_stream`, `generate`),
`responses` (`ResponsesApi`: `response`, `response_stream`) and `anthropic` (`MessagesApi`: `messages`,
`messages_stream`). Its methods of those names delegate to them, so it is the server's
`jaxchat.server.ServingBackend` (every API supported: `supports_responses` and `supports_messages` are
True). It takes requests already read by `jaxchat.api.request` (and the Responses / Messages readers);
it never re-reads a body. A non-streamed call returns the response dict (with `usage`); a stream is a
`ChunkStream` whose `usage` is set when the response is complete; errors found before the first chunk
are raised on the first `__anext__()`, a failure after it is one error item that ends the stream, and
closing a stream early aborts its engine requests. The pipeline's parts (`engine`, `tokenizer`,
`template`, `spec`, `grammar`, `model_id`, `max_context`) and its `prepare_chat` / `complete_chat` are
exposed for tools and tests; `expect_request()` announces a request to the engine, `stats()` gives the
server's gauges and `close()` stops the engine.
"""

from __future__ import annotations

from jaxchat.api.chat_completions import ChatCompletions
from jaxchat.api.chunk_stream import ChunkStream
from jaxchat.api.completions import TextCompletions
from jaxchat.api.messages_api import MessagesApi
from jaxchat.api.pipeline import ChatPipeline, Generated, PreparedChat, ServingEngine
from jaxchat.api.request import ChatRequest, CompletionRequest
from jaxchat.api.responses import ResponsesApi
from jaxchat.api.responses_request import ResponsesRequest

__all__ = ["ChatService"]


class ChatService:
    supports_responses = True
    supports_messages = True

    def __init__(self, engine: ServingEngine, model_id: str, grammar=None, chat_template: str | None = None) -> None:
        self.pipeline = ChatPipeline(engine, model_id, grammar, chat_template)
        self.chats = ChatCompletions(self.pipeline)
        self.texts = TextCompletions(self.pipeline)
        self.responses = ResponsesApi(self.pipeline)
        self.anthropic = MessagesApi(self.pipeline)

    # ---- the pipeline's parts --------------------------------------------------------------------------
    @property
    def model_id(self) -> str:
        return self.pipeline.model_id

    @property
    def max_context(self) -> int:
        return self.pipeline.max_context

    @property
    def engine(self) -> ServingEngine:
        return self.pipeline.engine

    @property
    def tokenizer(self):
        return self.pipeline.tokenizer

    @property
    def template(self):
        return self.pipeline.template

    @property
    def spec(self):
        return self.pipeline.spec

    @property
    def grammar(self):
        return self.pipeline.grammar

    def prepare_chat(self, request: ChatRequest) -> PreparedChat:
        return self.pipeline.prepare_chat(request)

    async def complete_chat(self, request: ChatRequest):
        return await self.pipeline.complete_chat(request)

    # ---- the wire APIs ---------------------------------------------------------------------------------
    async def chat_completion(self, request: ChatRequest) -> dict:
        return await self.chats.chat_completion(request)

    def chat_completion_stream(self, request: ChatRequest) -> ChunkStream:
        return self.chats.chat_completion_stream(request)

    async def completion(self, request: CompletionRequest) -> dict:
        return await self.texts.completion(request)

    def completion_stream(self, request: CompletionRequest) -> ChunkStream:
        return self.texts.completion_stream(request)

    async def generate(self, request: CompletionRequest) -> Generated:
        return await self.texts.generate(request)

    async def response(self, request: ResponsesRequest) -> dict:
        return await self.responses.response(request)

    def response_stream(self, request: ResponsesRequest) -> ChunkStream:
        return self.responses.response_stream(request)

    async def messages(self, request: ChatRequest) -> dict:
        return await self.anthropic.messages(request)

    def messages_stream(self, request: ChatRequest) -> ChunkStream:
        return self.anthropic.messages_stream(request)

    # ---- the engine ------------------------------------------------------------------------------------
    def expect_request(self):
        """Announce a generation request to the engine (`Engine.expect_request`): an object with `close()`, or None."""
        return self.pipeline.expect_request()

    def stats(self) -> dict:
        return self.pipeline.stats()

    def close(self) -> None:
        """Stop the engine (idempotent)."""
        self.pipeline.close()
