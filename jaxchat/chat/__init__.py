"""The chat library: formats and their detection, prefill, the prefix-stable parser, argument
dialects, streaming deltas, request validation and prompt rendering.

Contract: pure Python (stdlib and jinja2 only); it never imports jax, numpy, xgrammar or starlette,
which a test enforces. The names exported here are the ones docs/architecture.md promises.
"""

from jaxchat.chat.detect import chat_format_detect
from jaxchat.chat.envelopes import call_envelopes_on, native_call_opening
from jaxchat.chat.errors import RequestError
from jaxchat.chat.msg import ChatMsg, ChatMsgDelta, ChatParseOptions, ToolCall
from jaxchat.chat.parse import chat_parse, make_parser
from jaxchat.chat.prefill import chat_format_prefill
from jaxchat.chat.request import ConstraintRequest, chat_constraint_request_from_openai
from jaxchat.chat.spec import FORMAT_KINDS, ChatFormatSpec, chat_format_make
from jaxchat.chat.stream import ChatStream, apply_deltas, chat_compute_deltas, chat_finish_reason
from jaxchat.chat.template import ChatTemplate, TemplateError, TemplateRefused

__all__ = [
    "FORMAT_KINDS",
    "ChatFormatSpec",
    "ChatMsg",
    "ChatMsgDelta",
    "ChatParseOptions",
    "ChatStream",
    "ChatTemplate",
    "ConstraintRequest",
    "RequestError",
    "TemplateError",
    "TemplateRefused",
    "ToolCall",
    "apply_deltas",
    "call_envelopes_on",
    "native_call_opening",
    "chat_compute_deltas",
    "chat_constraint_request_from_openai",
    "chat_finish_reason",
    "chat_format_detect",
    "chat_format_make",
    "chat_format_prefill",
    "chat_parse",
    "make_parser",
]
