"""The wire APIs without HTTP: OpenAI chat completions, completions and Responses, and Anthropic Messages.

Contract: `parse_chat_request(body, limits)` / `parse_completion_request(body, limits)` raise every
400 about a body (`jaxchat.chat.RequestError`) and return frozen `ChatRequest` / `CompletionRequest`
values (`parse_responses_request` a `ResponsesRequest` around a `ChatRequest`,
`parse_messages_request` the Anthropic Messages API's `ChatRequest`); `Limits` is the one place a
bound is stated; `ChatService` (`service`) runs a typed request through template, tokenizer,
grammar, engine and parser: a `ChatPipeline` (`pipeline`, over a `ServingEngine`) with an adapter per wire
API, grouped by API: `openai` (Chat Completions and Completions, writing `shapes`), `responses` and
`anthropic` (each its reader, adapter and shapes);
`build_chat_service` loads a model and builds that pipeline. `RequestError` is the chat library's
(a 400 naming its `param`), re-exported for the layers above. This package never imports starlette,
and importing it does not import jax or xgrammar (only `build_chat_service` does, when called).
"""

from jaxchat.api.anthropic.request import parse_messages_request
from jaxchat.api.anthropic.shapes import error_json as messages_error_json
from jaxchat.api.build import build_chat_service, default_executable_cache, default_programs, model_id_for
from jaxchat.api.chunk_stream import ChunkStream
from jaxchat.api.limits import Limits
from jaxchat.api.pipeline import ChatPipeline, ServingEngine
from jaxchat.api.request import (
    ChatRequest,
    CompletionRequest,
    Sampling,
    parse_chat_request,
    parse_completion_request,
)
from jaxchat.api.responses.request import ResponsesRequest, parse_responses_request
from jaxchat.api.service import ChatService
from jaxchat.chat.errors import RequestError

__all__ = [
    "ChatPipeline",
    "ChatRequest",
    "ChatService",
    "ChunkStream",
    "CompletionRequest",
    "Limits",
    "RequestError",
    "ResponsesRequest",
    "Sampling",
    "ServingEngine",
    "build_chat_service",
    "default_executable_cache",
    "default_programs",
    "messages_error_json",
    "model_id_for",
    "parse_chat_request",
    "parse_completion_request",
    "parse_messages_request",
    "parse_responses_request",
]
