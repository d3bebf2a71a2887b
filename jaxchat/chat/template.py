"""Render a prompt with the model's own Jinja chat template, the way transformers does.

Contract:
- `ChatTemplate(source, bos_token="", eos_token="", special_tokens=None)` compiles `source` once in a
  sandboxed Jinja environment (`ImmutableSandboxedEnvironment`, `trim_blocks`/`lstrip_blocks`, loop
  controls, the `{% generation %}` block) with the globals and filters transformers gives templates:
  `raise_exception`, `strftime_now`, `namespace`, `dict`, and a `tojson` filter that never escapes HTML
  (`ensure_ascii=False` by default; `indent`, `separators`, `sort_keys` accepted; the lazy results of
  `map` / `select` dump as lists).
- `.render(messages, tools=None, add_generation_prompt=True, **template_kwargs) -> str` renders OpenAI
  chat messages. Messages are normalised into the shape templates expect: keys set to None are
  dropped, except that a missing or null `content` (an assistant turn with only tool calls) becomes
  "", which every template handles while some (Qwen3) fail on a missing one; a content list of text
  parts becomes one string (parts joined with "\\n"); assistant `tool_calls` keep the OpenAI form and
  their `function.arguments` JSON string is decoded to a mapping (most templates apply `| tojson` to
  it), with `name` / `arguments` also at the top level of each call; reasoning given as
  `reasoning_content`, `reasoning` or `thinking` is visible under `reasoning_content` and `thinking`.
  An empty tools list reads as no tools. Template variables: `messages`, `tools`, `documents` (None),
  `add_generation_prompt`, the special tokens, `bos_token`, `eos_token`, then `template_kwargs`
  (e.g. `enable_thinking`), which override the tokens.
- User data is only ever data: Jinja syntax inside a message or tool is rendered as text. Anything
  that goes wrong in a template, including `raise_exception(msg)` and any attempt to reach Python
  internals (an unsafe attribute fails at once rather than rendering as empty), raises
  `TemplateError` (a `ValueError`); its subclass `TemplateRefused` is an input the template refused
  (`raise_exception(msg)`, or a message shape no template can take), whose message is for the
  request's author, while the others are the template's own failures.
- `.tools_enabled` tells whether the template renders tools at all (a probe tool shows up in the
  prompt).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from functools import cached_property
from typing import Any, ClassVar

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplate", "TemplateError", "TemplateRefused", "normalize_messages"]

_REASONING_KEYS = ("reasoning_content", "thinking", "reasoning")
_PROBE_TOOL = "jaxchat_probe_tool_q7x"


class TemplateError(ValueError):
    """A chat template could not be compiled or rendered, or rejected its input."""


class TemplateRefused(TemplateError):
    """The input was refused: by the template itself (`raise_exception`, e.g. roles that do not
    alternate) or for a shape no template can take. The message is meant for the request's author."""


class _Refusal(jinja2.exceptions.TemplateError):
    """What `raise_exception` raises inside the template."""


# --- the Jinja environment -------------------------------------------------------------------


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; here it renders its body."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_render_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render_body(self, caller: Any) -> str:
        return caller()


class _SafeNamespace(jinja2.utils.Namespace):
    """A `namespace()` that refuses underscore-prefixed attribute names."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # `self` comes first in args, so that `namespace(self=...)` works
        self, rest = args[0], args[1:]
        values = dict(*rest, **kwargs)
        for key in values:
            _SafeNamespace._check(key)
        jinja2.utils.Namespace.__init__(self, values)

    def __setitem__(self, key: str, value: Any) -> None:
        _SafeNamespace._check(key)
        jinja2.utils.Namespace.__setitem__(self, key, value)

    @staticmethod
    def _check(key: Any) -> None:
        if isinstance(key, str) and key.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {key!r} starts with an underscore")


class _DictFactory:
    """`dict(...)` for templates, without exposing the `dict` type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, keys: Any, value: Any = None) -> dict:
        return dict.fromkeys(keys, value)


def _raise_exception(message: Any) -> None:
    raise _Refusal(str(message))


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys,
                      default=_listed)


def _listed(value: Any) -> list:
    """The lazy sequences of Jinja filters (`tools | map(attribute='function')`) dump as lists."""
    if isinstance(value, Iterator):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, except that reaching for an unsafe attribute fails instead of rendering ""."""

    def unsafe_undefined(self, obj: Any, attribute: str) -> jinja2.Undefined:
        raise jinja2.exceptions.SecurityError(
            f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is unsafe"
        )


def _make_environment() -> ImmutableSandboxedEnvironment:
    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols, _GenerationBlock])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _SafeNamespace
    env.globals["dict"] = _DictFactory()
    return env


# --- message normalisation --------------------------------------------------------------------


def _plain(value: Any, where: str) -> Any:
    """A fresh copy of `value` made only of JSON types (tuples stay tuples), with None-valued keys kept."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_plain(v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, list):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    raise TemplateRefused(f"{where}: cannot pass a {type(value).__name__} to a chat template")


def _content_text(content: Any, where: str) -> Any:
    if not isinstance(content, list):
        return content
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise TemplateRefused(f"{where}[{j}]: unsupported content part type {kind!r} (only text parts)")
    return "\n".join(texts)


def _decode_arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except ValueError:
            return arguments
        if isinstance(decoded, dict):
            return decoded
    return arguments


def _tool_call(call: Any, where: str) -> dict:
    if not isinstance(call, dict):
        raise TemplateRefused(f"{where}: a tool call must be an object")
    call = dict(call)
    function = call.get("function")
    if isinstance(function, dict):
        function = dict(function)
        if "arguments" in function:
            function["arguments"] = _decode_arguments(function["arguments"])
        call["function"] = function
        for key in ("name", "arguments"):
            if key in function and key not in call:
                call[key] = function[key]
    elif "arguments" in call:
        call["arguments"] = _decode_arguments(call["arguments"])
    return call


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    """OpenAI chat messages in the shape chat templates expect (see the module docstring)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TemplateRefused("messages: must be a list of message objects")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise TemplateRefused(f"{where}: must be an object, got {type(message).__name__}")
        msg = {k: v for k, v in _plain(message, where).items() if v is not None}
        if not isinstance(msg.get("role"), str):
            raise TemplateRefused(f"{where}.role: must be a string")
        msg["content"] = _content_text(msg.get("content", ""), f"{where}.content")
        if "tool_calls" in msg:
            if not isinstance(msg["tool_calls"], list):
                raise TemplateRefused(f"{where}.tool_calls: must be a list")
            msg["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(msg["tool_calls"])]
        reasoning = next((msg[k] for k in _REASONING_KEYS if k in msg), None)
        if reasoning is not None:
            msg.setdefault("thinking", reasoning)
            msg["reasoning_content"] = reasoning
        out.append(msg)
    return out


# --- the template -----------------------------------------------------------------------------


class ChatTemplate:
    """A compiled chat template plus the special tokens it may refer to."""

    def __init__(
        self, source: str, bos_token: str = "", eos_token: str = "", special_tokens: Mapping[str, str] | None = None
    ):
        if not isinstance(source, str):
            raise TemplateError("chat template: source must be a string")
        self.source = source
        self._variables: dict[str, Any] = {str(k): v for k, v in (special_tokens or {}).items() if v is not None}
        self._variables["bos_token"] = bos_token
        self._variables["eos_token"] = eos_token
        try:
            self._compiled = _make_environment().from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"chat template does not compile: {exc}") from exc

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text for `messages` (and `tools`), ending with the assistant's turn header if asked."""
        variables = dict(self._variables)
        variables.update(
            messages=normalize_messages(messages),
            tools=_plain(list(tools), "tools") if tools else None,
            documents=None,
            add_generation_prompt=bool(add_generation_prompt),
        )
        variables.update(_plain(template_kwargs, "chat_template_kwargs"))
        try:
            return self._compiled.render(**variables)
        except _Refusal as exc:
            raise TemplateRefused(exc.message or "the chat template refused these messages") from exc
        except jinja2.TemplateError as exc:
            raise TemplateError(exc.message or type(exc).__name__) from exc
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, ArithmeticError, RecursionError) as exc:
            raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from exc

    @cached_property
    def tools_enabled(self) -> bool:
        """Whether the template puts tools into the prompt (it renders a probe tool's name)."""
        probe = [{"role": "user", "content": "What is the weather?"}]
        tool = {
            "type": "function",
            "function": {
                "name": _PROBE_TOOL,
                "description": "Probe tool.",
                "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
            },
        }
        try:
            with_tools = self.render(probe, tools=[tool])
            without = self.render(probe)
        except TemplateError:
            return False
        return _PROBE_TOOL in with_tools and _PROBE_TOOL not in without
