"""`ChatService`: one model's serving pipeline with an adapter per wire API, for the HTTP server and `jaxchat.LLM`.

Contract: `ChatService(engine, model_id, grammar=None, chat_template=None)` is a `ChatPipeline`
(`jaxchat.api.pipeline`: template, tokenizer, the model's one `ChatFormatSpec`, grammar, engine; its
`prepare_chat` / `complete_chat`, `expect_request()`, `stats()` and `close()`) that also holds the adapters
writing each wire API from it, each a `jaxchat.server.WireApi` (`answer(request)`, `stream(request)`):
`chats` (`openai.chat_completions.ChatCompletions`, `/v1/chat/completions`), `texts`
(`openai.completions.TextCompletions`, `/v1/completions`; also `generate(request)`, one choice to its end, for
`jaxchat.LLM.generate`), `responses` (`responses.adapter.ResponsesApi`, `/v1/responses`) and `anthropic`
(`anthropic.adapter.MessagesApi`, `/v1/messages`). It is therefore the server's `jaxchat.server.ServingBackend`,
with every API offered. The adapters take requests already read by `jaxchat.api.request` (and the Responses /
Messages readers) and never re-read a body. A reply is the API's dict (with `usage`); a stream is a
`ChunkStream` whose `usage` is set when the response is complete; errors found before the first chunk are
raised on the first `__anext__()`, a failure after it is one error item that ends the stream, and closing a
stream early aborts its engine requests. Nothing here forwards: the service adds only its adapters.
"""

from __future__ import annotations

from jaxchat.api.anthropic.adapter import MessagesApi
from jaxchat.api.openai.chat_completions import ChatCompletions
from jaxchat.api.openai.completions import TextCompletions
from jaxchat.api.pipeline import ChatPipeline, ServingEngine
from jaxchat.api.responses.adapter import ResponsesApi

__all__ = ["ChatService"]


class ChatService(ChatPipeline):
    def __init__(self, engine: ServingEngine, model_id: str, grammar=None, chat_template: str | None = None) -> None:
        super().__init__(engine, model_id, grammar, chat_template)
        self.chats = ChatCompletions(self)
        self.texts = TextCompletions(self)
        self.responses = ResponsesApi(self)
        self.anthropic = MessagesApi(self)
