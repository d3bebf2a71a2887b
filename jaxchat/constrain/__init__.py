"""Constrained decoding on the host: structural tags per format, the grammar engine, token bans.

Contract: imports `jaxchat.chat`, xgrammar and numpy, never jax. `chat_structural_tag(spec, request)`
says what a request allows; `GrammarEngine(tokenizer, vocab_size)` (one per model) compiles it and
builds per-request constraints (`make`) that the engine's host loop drives through the
`jaxchat.engine.types.Constraint` protocol; `accepts` checks a whole output against a request.
"""

from jaxchat.constrain.constraint import GrammarConstraint, TokenBanConstraint, token_ban_constraint
from jaxchat.constrain.grammar_engine import GrammarEngine, chat_make_constraint
from jaxchat.constrain.pyargs import argument_list_rules, python_calls_grammar
from jaxchat.constrain.tags import callable_tools, chat_structural_tag, format_markers, text_markers

__all__ = [
    "GrammarConstraint",
    "GrammarEngine",
    "TokenBanConstraint",
    "argument_list_rules",
    "callable_tools",
    "chat_make_constraint",
    "chat_structural_tag",
    "format_markers",
    "python_calls_grammar",
    "text_markers",
    "token_ban_constraint",
]
