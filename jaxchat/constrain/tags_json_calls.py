"""Structural tags for the tool calls of llama3_json, mistral and deepseek_v3.

Contract: `call_tags(spec, name, arguments)` is the tag of one call of tool `name` in the spec's
variant, and `calls_format(spec, tools, at_least_one, single, excludes)` the xgrammar format of a
turn's calls, given `tools` as (name, argument format) pairs built by `constrain.tags` (so the
argument rules — schema bounds, excluded markers — live in one place):
  - `at_least_one`: calls only, at least one, nothing before or after them;
  - otherwise free text in which calls may appear, where the parser (`chat.parse_inline`,
    `chat.parse`) would read them;
  - `single`: at most one call (always so for Llama's "single" variant, whose templates refuse a
    second call).
Shapes, per kind (the markers come from `jaxchat.chat.spec`):
  - deepseek_v3: `<｜tool▁calls▁begin｜>` call (sep call)* `<｜tool▁calls▁end｜>`, a call being
    `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```<｜tool▁call▁end｜>` with sep "\\n"
    (r1), or `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>` with no sep (v3_1);
    free text triggers blocks at `<｜tool▁calls▁begin｜>`;
  - mistral: `[TOOL_CALLS]NAME[ARGS]ARGS` per call (args; a `[CALL_ID]` of 9 letters or digits may
    precede `[ARGS]`), or `[TOOL_CALLS][{"name": "NAME", "arguments": ARGS}, ...]` (json_array,
    each object optionally ending with `, "id": "<9 letters or digits>"`); free text triggers them
    at `[TOOL_CALLS]` and may continue after them;
  - llama3_json: `{"name": "NAME", "parameters": ARGS}` calls (joined by "; " in the semicolon
    variant), bare or after `<|python_tag|>`. Bare calls are read only at the very start of the
    content, so free text may not start with `{` (after at most 4 whitespace characters) nor with
    `<|`; free text may end with `<|python_tag|>` calls, and nothing follows calls.
With `envelopes` (`tags_envelopes`), the free text of llama3_json and mistral json_array also carries
the call-envelope triggers; Llama's single variant (or `single`) then allows one call in all: an
envelope call in the text (free text after it, no call) or a `<|python_tag|>` call after text without one.
"""

from __future__ import annotations

import json

from jaxchat.chat import ChatFormatSpec
from jaxchat.chat.spec import DEEPSEEK_CALL_BEGIN, DEEPSEEK_CALL_END, DEEPSEEK_SEP, MISTRAL_ARGS, MISTRAL_CALL_ID
from jaxchat.constrain.tags_envelopes import EnvelopeTools, add_envelopes

KINDS = frozenset({"llama3_json", "mistral", "deepseek_v3"})

_CALL_ID = r"[A-Za-z0-9]{9}"
# Free text of llama3_json: its first character is neither `{` (a bare call) nor the start of `<|`.
_LLAMA_TEXT_START = r"[ \t\n\r]{0,4}([^{< \t\n\r]|<[^|<])"


def _tag(begin: str, content: dict, end: str) -> dict:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def _seq(*elements: dict) -> dict:
    return {"type": "sequence", "elements": list(elements)}


def _const(value: str) -> dict:
    return {"type": "const_string", "value": value}


def _optional(content: dict) -> dict:
    return {"type": "optional", "content": content}


def _or(*elements: dict) -> dict:
    return {"type": "or", "elements": list(elements)}


def _separated(tags: list[dict], separator: str, single: bool) -> dict:
    if single and len(tags) == 1:
        return tags[0]
    return {"type": "tags_with_separator", "tags": tags, "separator": separator, "at_least_one": True,
            "stop_after_first": single}


def _triggered(spec: ChatFormatSpec, tags: list[dict], single: bool, excludes,
               envelopes: EnvelopeTools | None = None) -> dict:
    triggered = {"type": "triggered_tags", "triggers": [spec.tool_start], "tags": tags, "at_least_one": False,
                 "stop_after_first": single, "excludes": [m for m in excludes if m != spec.tool_start]}
    return triggered if envelopes is None else add_envelopes(triggered, envelopes.formats(single, excludes))


def call_tags(spec: ChatFormatSpec, name: str, arguments: dict) -> list[dict]:
    """The tag of one call of `name` whose arguments follow the format `arguments`."""
    if spec.kind == "deepseek_v3":
        if spec.variant == "r1":
            return [_tag(f"{DEEPSEEK_CALL_BEGIN}function{DEEPSEEK_SEP}{name}\n```json\n", arguments, f"\n```{DEEPSEEK_CALL_END}")]
        return [_tag(f"{DEEPSEEK_CALL_BEGIN}{name}{DEEPSEEK_SEP}", arguments, DEEPSEEK_CALL_END)]
    if spec.kind == "mistral":
        if spec.variant == "args":
            call_id = _optional({"type": "regex", "pattern": _regex_literal(MISTRAL_CALL_ID) + _CALL_ID})
            return [_tag(spec.tool_start + name, _seq(call_id, _const(MISTRAL_ARGS), arguments), "")]
        call_id = _optional({"type": "regex", "pattern": _regex_literal(', "id": "') + _CALL_ID + '"'})
        return [_tag('{"name": ' + json.dumps(name) + ', "arguments": ', _seq(arguments, call_id), "}")]
    if spec.kind == "llama3_json":
        return [_tag('{"name": ' + json.dumps(name) + ', "parameters": ', arguments, "}")]
    raise ValueError(f"chat format {spec.kind!r} is not one of {sorted(KINDS)}")


def _regex_literal(text: str) -> str:
    return "".join("\\" + c if c in r"\^$.|?*+()[]{}" else c for c in text)


def calls_format(spec: ChatFormatSpec, tools: list[tuple[str, dict]], at_least_one: bool, single: bool,
                 excludes, envelopes: EnvelopeTools | None = None) -> dict:
    """The calls of a turn (see the module contract); `envelopes` join the free text (not with
    `at_least_one`, which has none)."""
    tags = [tag for name, arguments in tools for tag in call_tags(spec, name, arguments)]
    if spec.kind == "deepseek_v3":
        separator = "\n" if spec.variant == "r1" else ""
        block = _tag(spec.tool_start, _separated(tags, separator, single), spec.tool_end)
        return block if at_least_one else _triggered(spec, [block], single, excludes)
    if spec.kind == "mistral" and spec.variant == "json_array":
        array = _tag(spec.tool_start + "[", _separated(tags, ", ", single), "]")
        return array if at_least_one else _triggered(spec, [array], single, excludes, envelopes)
    if spec.kind == "mistral":
        return _separated(tags, "", single) if at_least_one else _triggered(spec, tags, single, excludes)
    return _llama_calls(spec, tags, at_least_one, single or spec.variant == "single", excludes, envelopes)


def _free_text(excludes, envelopes: EnvelopeTools, single: bool) -> dict:
    """Free text whose call envelopes trigger their calls."""
    free = {"type": "triggered_tags", "triggers": [], "tags": [], "at_least_one": False, "stop_after_first": single,
            "excludes": list(excludes)}
    return add_envelopes(free, envelopes.formats(single, excludes))


def _llama_calls(spec: ChatFormatSpec, tags: list[dict], at_least_one: bool, single: bool, excludes,
                 envelopes: EnvelopeTools | None = None) -> dict:
    calls = _or(*tags) if single else _separated(tags, "; ", single)
    tagged = _seq(_const(spec.tool_start), calls)
    if at_least_one:
        return _or(calls, tagged)
    start = {"type": "regex", "pattern": _LLAMA_TEXT_START}
    if envelopes is None:
        text = _seq(start, {"type": "any_text", "excludes": list(excludes)}, _optional(tagged))
    elif single:  # one call in all: an envelope call in the text, or a tagged call after text without one
        text = _or(_seq(start, _free_text(excludes, envelopes, True)),
                   _seq(start, {"type": "any_text", "excludes": [*excludes, *envelopes.every_head()]},
                        _optional(tagged)))
    else:
        text = _seq(start, _free_text(excludes, envelopes, False), _optional(tagged))
    return _or(calls, tagged, text, _const(""))
