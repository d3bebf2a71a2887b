"""Structural tags: what a request allows the model to write, as an xgrammar structural tag.

Contract: `chat_structural_tag(spec, request, tools_enabled=True)` returns a JSON-able dict in
xgrammar's structural-tag format (`{"type": "structural_tag", "format": {...}}`), or None when
nothing needs constraining (no callable tools, a "text" response_format and no structured-output field). The same
`ChatFormatSpec` drives `jaxchat.chat.chat_parse`, so every text the tag accepts parses into what
the request asked for. Layout:

    [reasoning?]  optional `reasoning_start any_text reasoning_end ws{0,4}` (only when reasoning is
                  allowed; optional so that a prefill that already opened it is accepted)
    body          tool_choice auto:      free text with triggered tool tags (or, under a JSON
                                         response_format, the JSON or tool calls)
                                         and, for the JSON-call kinds, call envelopes
                                         (`tags_envelopes`: a declared tool's name key in free
                                         text triggers the rest of its call)
                  tool_choice required:  at least one call, nothing before it
                  named function:        exactly one call of that function
                  none / no tools:       the content (JSON of the schema under json_schema; the regex,
                                         choice, grammar or JSON of `request.output`: `output.py`)
                  parallel_tool_calls false: nothing after the first call

Per-tool tags follow xgrammar's builtin styles (hermes_json = `qwen_3`, qwen_xml = `qwen_3_coder`,
gemma4 = `gemma_4`, harmony = `harmony`); LFM2's Python call lists are EBNF built by
`jaxchat.constrain.pyargs.argument_list_rules`; the calls of llama3_json, mistral and deepseek_v3
are composed by `jaxchat.constrain.tags_json_calls` around the arguments built here. Tool arguments
(`_arguments`) admit the schema's top-level properties in any order, each at most once, every
required one present, no other one (`jaxchat.constrain.objects.any_order_arguments` for the styles,
pyargs for LFM2): exact up to `any_order.MAX_ANY_ORDER` properties, any order within groups of that
many above, the declared order where the schema allows extra properties or constrains which key sets
are valid; nested objects and the response_format's JSON keep the declared order. A custom tool with a Lark
or regex grammar has its input under its grammar (`jaxchat.constrain.custom_tools`): the arguments
`{"input": "..."}` with the grammar inside the JSON string, the raw input as its one parameter in qwen_xml, a
verbatim `<|"|>` string in gemma4, `input="..."` in LFM2's Python calls. JSON arguments and
content are bounded: integers and numbers to 16 integer digits (via a schema range; xgrammar then
allows 6 fraction digits), whitespace runs to `MAX_WS` characters. A strict json_schema response_format
with no callable tools is written compact instead (keys in the declared order, no whitespace between
tokens, as OpenAI's structured outputs write it), so every key and separator is forced text, which
jump-forward appends without sampling. Marker strings never appear
inside free text or strings.
`RequestError` (400) for tool_choice required / named when the template leaves tools out of the
prompt (`tools_enabled` false) or the format has no tool-call syntax (`plain`); auto drops them.
"""

from __future__ import annotations

import functools
import json
import re

import xgrammar as xgr

from jaxchat.chat import ChatFormatSpec, ConstraintRequest, RequestError, call_envelopes_on, native_call_opening
from jaxchat.constrain.custom_tools import custom_arguments, python_arguments
from jaxchat.constrain.objects import any_order_arguments
from jaxchat.constrain.output import output_format
from jaxchat.constrain.pyargs import python_calls_grammar
from jaxchat.constrain.tags_envelopes import ENVELOPE_WS, EnvelopeTools, add_envelopes
from jaxchat.constrain.tags_json_calls import KINDS as JSON_CALL_KINDS
from jaxchat.constrain.tags_json_calls import call_tags, calls_format

MAX_WS = 4
INT_BOUND = 10**16 - 1
HARMONY_SEP = "<|start|>assistant"
HARMONY_FINAL = "<|channel|>final<|message|>"
HARMONY_MARKERS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
# Stop tokens that the harmony grammar matches as text: keep them out of xgrammar's stop list.
TEXT_MARKERS = {"harmony": ("<|call|>", "<|return|>", "<|end|>")}


def text_markers(spec: ChatFormatSpec) -> tuple[str, ...]:
    """Stop-token strings that this format's grammar matches as text."""
    return TEXT_MARKERS.get(spec.kind, ())


def guarded_markers(spec: ChatFormatSpec) -> tuple[str, ...]:
    """Markers that are never free text: a grammar may need them only structurally (not the tool
    opener, which triggers tags from free text, nor the ends of free-text regions)."""
    free_ends = {spec.tool_start, spec.reasoning_end, "<|end|>", "<|return|>"}
    return tuple(m for m in format_markers(spec) if m not in free_ends)


def format_markers(spec: ChatFormatSpec) -> tuple[str, ...]:
    """Every marker string of the format: kept out of free text and argument strings."""
    extra = HARMONY_MARKERS if spec.kind == "harmony" else ()
    found = [spec.reasoning_start, spec.reasoning_end, spec.tool_start, spec.tool_end, *spec.stop_markers, *extra]
    return tuple(dict.fromkeys(m for m in found if m and m.strip() == m))


def _any_text(excludes) -> dict:
    return {"type": "any_text", "excludes": list(excludes)}


def _tag(begin: str, content: dict, end) -> dict:
    return {"type": "tag", "begin": begin, "content": content, "end": end}


def _seq(*elements) -> dict:
    return {"type": "sequence", "elements": list(elements)}


def bounded_schema(schema):
    """A copy of `schema` whose integers and numbers have a range (so at most 16 integer digits)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    types = schema.get("type")
    types = types if isinstance(types, list) else [types]
    if ("integer" in types or "number" in types) and "enum" not in schema and "const" not in schema:
        if "minimum" not in schema and "exclusiveMinimum" not in schema:
            out["minimum"] = -INT_BOUND
        if "maximum" not in schema and "exclusiveMaximum" not in schema:
            out["maximum"] = INT_BOUND
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        if isinstance(schema.get(key), dict):
            out[key] = {k: bounded_schema(v) for k, v in schema[key].items()}
    for key in ("items", "additionalProperties", "not", "contains"):
        if isinstance(schema.get(key), dict):
            out[key] = bounded_schema(schema[key])
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        if isinstance(schema.get(key), list):
            out[key] = [bounded_schema(s) for s in schema[key]]
    return out


def string_excludes(markers) -> list[str]:
    """What JSON strings must not contain so that `markers` never appear in them: xgrammar's
    `excludes`, whose compile cost grows with the total excluded length (~25 ms per character on a
    150k vocabulary), so every marker spelled `<|...` collapses into `<|`, every `...|>` into
    `|>` and DeepSeek's `<｜...` into `<｜` (a string may then not contain those two-character
    sequences at all, as LFM2's Python strings already may not); other markers (`</tool_call>`,
    `<think>`, `[TOOL_CALLS]`) are excluded exactly."""
    out = []
    for m in dict.fromkeys(m for m in markers if m):
        if m.startswith("<|"):
            m = "<|"
        elif m.endswith("|>"):
            m = "|>"
        elif m.startswith("<｜"):
            m = "<｜"
        if m not in out:
            out.append(m)
    return out


def _json(spec: ChatFormatSpec | None, schema, style: str = "json", excludes=(), max_ws: int = MAX_WS) -> dict:
    """JSON (or a builtin argument style) of `schema`, bounded, with `excludes` kept out of strings."""
    fmt = {"type": "json_schema", "json_schema": bounded_schema(schema), "max_whitespace_cnt": max_ws}
    if style != "json":
        fmt["style"] = style
    if excludes:
        fmt["excludes"] = string_excludes(excludes)
    return fmt


def argument_markers(spec: ChatFormatSpec) -> tuple[str, ...]:
    """Markers the parser acts on inside a tool call's arguments: the call's end and the turn's stops
    (Harmony: every message boundary)."""
    if spec.kind == "harmony":
        return HARMONY_MARKERS
    return (spec.tool_end, *spec.stop_markers, *spec.extra_stops)


def content_markers(spec: ChatFormatSpec, request: ConstraintRequest) -> tuple[str, ...]:
    """Markers the parser acts on in the content region: the stops, the reasoning opener, and the tool
    opener when tool calls are parsed (tools given and tool_choice not "none")."""
    if spec.kind == "harmony":
        return HARMONY_MARKERS
    tools_parsed = bool(request.tools) and request.tool_choice != "none" and spec.has_tools
    opener = spec.tool_start if tools_parsed else ""
    reasoning = spec.reasoning_start if spec.reasoning else ""
    return (*spec.stop_markers, *spec.extra_stops, reasoning, opener)


def _arguments(spec: ChatFormatSpec, params: dict, style: str = "json", max_ws: int = MAX_WS) -> dict:
    """A tool's arguments: its schema's top-level properties in any order (`objects.py`), values as
    the builtin style constrains them, the call's markers kept out of strings, whitespace runs up to
    `max_ws`. Cached by schema (the same tools come with every request of a conversation); the returned
    dict is shared, read-only."""
    return _cached_arguments(json.dumps(params, ensure_ascii=False), style, argument_markers(spec), max_ws)


@functools.lru_cache(maxsize=1024)
def _cached_arguments(params_json: str, style: str, markers: tuple[str, ...], max_ws: int) -> dict:
    return any_order_arguments(_json(None, json.loads(params_json), style, markers, max_ws))


def _tool_arguments(spec: ChatFormatSpec, tool: dict, style: str = "json", max_ws: int = MAX_WS) -> dict:
    """A tool's arguments (`_arguments`); a custom tool with a grammar: its input under its grammar in the
    argument style (`custom_tools`)."""
    custom = custom_arguments(tool, style)
    return _arguments(spec, _params(tool), style, max_ws) if custom is None else custom


def _params(tool: dict) -> dict:
    params = tool["function"].get("parameters")
    return params if isinstance(params, dict) else {"type": "object", "properties": {}}


def tool_tag(spec: ChatFormatSpec, tool: dict) -> list[dict]:
    """The tag(s) of one tool call in the builtin style of the format (several spellings for harmony)."""
    name = tool["function"]["name"]
    ts, te = spec.tool_start, spec.tool_end
    if spec.kind in JSON_CALL_KINDS:
        return call_tags(spec, name, _tool_arguments(spec, tool))
    if spec.kind == "hermes_json":  # xgrammar "qwen_3"
        begin = native_call_opening(spec, name)
        return [_tag(begin, _tool_arguments(spec, tool), "}\n" + te)]
    if spec.kind == "qwen_xml":  # xgrammar "qwen_3_coder"; the newline before </function> is the content's
        # trailing whitespace, so a call without parameters may be `<function=NAME>\n</function>`
        return [_tag(f"{ts}\n<function={name}>\n", _tool_arguments(spec, tool, "qwen_xml"), f"</function>\n{te}")]
    if spec.kind == "gemma4":  # xgrammar "gemma_4"
        return [_tag(f"{ts}call:{name}", _tool_arguments(spec, tool, "gemma"), te)]
    if spec.kind == "harmony":  # xgrammar "harmony", plus the spacing gpt-oss emits
        content = _tool_arguments(spec, tool)
        heads = (
            f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>",
            f"<|channel|>commentary to=functions.{name}<|constrain|>json<|message|>",
            f" to=functions.{name}<|channel|>commentary <|constrain|>json<|message|>",
            f" to=functions.{name}<|channel|>commentary json<|message|>",
        )
        return [_tag(head, content, te) for head in heads]
    raise ValueError(f"chat format {spec.kind!r} has no tool-call syntax")


def _calls(spec: ChatFormatSpec, tools, at_least_one: bool, single: bool, excludes,
           envelopes: EnvelopeTools | None = None) -> dict:
    """Tool calls: with `at_least_one`, one or more calls separated by a newline and nothing else;
    otherwise free text in which the tool opener triggers a call (and, with `envelopes`, the name
    keys of call envelopes trigger theirs)."""
    if spec.kind in JSON_CALL_KINDS:
        arguments = [(t["function"]["name"], _tool_arguments(spec, t)) for t in tools]
        return calls_format(spec, arguments, at_least_one, single, excludes, envelopes)
    if spec.kind == "lfm2":
        custom = {t["function"]["name"]: args for i, t in enumerate(tools)
                  if (args := python_arguments(t, f"c{i}_")) is not None}
        grammar = python_calls_grammar([(t["function"]["name"], _params(t)) for t in tools], single, custom)
        tags = [_tag(spec.tool_start + "[", {"type": "grammar", "grammar": grammar}, "]" + spec.tool_end)]
    else:
        tags = [tag for t in tools for tag in tool_tag(spec, t)]
    if single and len(tools) == 1 and at_least_one and spec.kind != "lfm2" and len(tags) == 1:
        return tags[0]
    if at_least_one:  # calls only: no text before, between or after them
        return {"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True, "stop_after_first": single}
    triggered = {
        "type": "triggered_tags",
        "triggers": [spec.tool_start],
        "tags": tags,
        "at_least_one": at_least_one,
        "stop_after_first": single,
        "excludes": [m for m in excludes if m != spec.tool_start],
    }
    return triggered if envelopes is None else add_envelopes(triggered, envelopes.formats(single, excludes))


def envelope_tools(spec: ChatFormatSpec, request: ConstraintRequest, tools) -> EnvelopeTools | None:
    """The call envelopes of a request's free text (`tags_envelopes`), or None when it reads none."""
    if not call_envelopes_on(spec, request):
        return None
    callable_ = tuple((t["function"]["name"], _tool_arguments(spec, t, max_ws=ENVELOPE_WS)) for t in tools)
    return EnvelopeTools(callable_, request.tool_names)


def _content(spec: ChatFormatSpec, request: ConstraintRequest) -> dict | None:
    excl = content_markers(spec, request)
    if request.output is not None:  # a regex, choice, grammar or JSON schema from the structured-output fields
        fmt = output_format(request.output)
        return fmt if fmt is not None else _json(spec, request.output.schema, excludes=excl)
    if request.response_format == "json_schema" and isinstance(request.json_schema, dict):
        fmt = _json(spec, request.json_schema, excludes=excl)
        compact = _compact_json_grammar(json.dumps(fmt, ensure_ascii=False)) if (
            request.json_schema_strict and not request.callable_tools) else None
        return fmt if compact is None else {"type": "grammar", "grammar": compact}
    if request.response_format in ("json_object", "json_schema"):
        return _json(spec, {"type": "object"}, excludes=excl)
    return None


_WS_RULE = re.compile(r'^(\w+ ::= )\(\"\" \| \(\[ \\n\\r\\t\]\)\)$', re.M)


@functools.lru_cache(maxsize=256)
def _compact_json_grammar(fmt_json: str) -> str | None:
    """A `_json` format's grammar with no whitespace between tokens: xgrammar's own grammar for the format at
    one whitespace character per gap (every gap is then a rule `("" | ([ \n\r\t]))`), each gap rule made
    empty. Strings, excludes and bounds stay as xgrammar built them. None (keep the format) where xgrammar
    cannot build it (its error then comes from the format itself) or prints a gap of another shape."""
    fmt = {**json.loads(fmt_json), "max_whitespace_cnt": 1}
    try:
        printed = str(xgr.Grammar.from_structural_tag(json.dumps({"type": "structural_tag", "format": fmt},
                                                                 ensure_ascii=False)))
    except RuntimeError:
        return None
    compact, gaps = _WS_RULE.subn(r'\1("")', printed)
    return compact if gaps and not re.search(r"\[ \\n\\r\\t\]", compact) else None


def callable_tools(spec: ChatFormatSpec, request: ConstraintRequest, tools_enabled: bool = True) -> tuple[dict, ...]:
    """The tools the grammar lets the model call; RequestError when a call is demanded but impossible."""
    tools = request.callable_tools
    if not tools:
        return ()
    if not tools_enabled or not spec.has_tools:
        if request.tool_choice == "required":
            why = "this model's chat template leaves tools out of the prompt" if spec.has_tools and not tools_enabled \
                else f"this model's chat format ({spec.kind}) has no tool-call syntax"
            raise RequestError("tool_choice", f"tool_choice {_choice_name(request)} cannot be honoured: {why}")
        return ()
    return tools


def _choice_name(request: ConstraintRequest) -> str:
    return f"function {request.named_tool!r}" if request.named_tool else repr(request.tool_choice)


def _reasoning_prefix(spec: ChatFormatSpec, excludes) -> dict:
    inner = [m for m in excludes if m not in (spec.reasoning_end, spec.tool_start, spec.tool_end)]
    block = _tag(spec.reasoning_start, _any_text(inner), spec.reasoning_end)
    return {"type": "optional", "content": _seq(block, {"type": "regex", "pattern": rf"[ \t\n\r]{{0,{MAX_WS}}}"})}


def _harmony_body(spec, request, tools, content) -> dict | None:
    markers = format_markers(spec)
    calls = [tag for t in tools for tag in tool_tag(spec, t)]
    final = _tag(HARMONY_FINAL, content or _any_text(markers), ["<|return|>", "<|end|>"])
    if not tools:
        if content is None:
            return None
        body = final
    elif request.tool_choice == "required":
        body = {"type": "or", "elements": calls}
    else:
        body = {"type": "or", "elements": [final, *calls]}
    if not (spec.reasoning and request.allow_reasoning):
        return body
    analysis = _tag(spec.reasoning_start, _any_text([m for m in markers if m != "<|end|>"]), "<|end|>")
    messages = {"type": "star", "content": _seq(analysis, {"type": "const_string", "value": HARMONY_SEP})}
    return _seq(messages, body)


def chat_structural_tag(spec: ChatFormatSpec, request: ConstraintRequest, tools_enabled: bool = True) -> dict | None:
    """The xgrammar structural tag (a dict) constraining the output of `request`, or None."""
    tools = callable_tools(spec, request, tools_enabled)
    content = _content(spec, request)
    if spec.kind == "harmony":
        body = _harmony_body(spec, request, tools, content)
        return None if body is None else {"type": "structural_tag", "format": body}
    if not tools and content is None:
        return None
    excludes = format_markers(spec)
    single = not request.parallel_tool_calls
    if not tools:
        body = content
    elif request.named_tool is not None:
        named = [t for t in tools if t["function"]["name"] == request.named_tool] or list(tools[:1])
        body = _calls(spec, named, True, True, excludes)
    elif request.tool_choice == "required":
        body = _calls(spec, tools, True, single, excludes)
    elif content is None:
        body = _calls(spec, tools, False, single, excludes, envelope_tools(spec, request, tools))
    else:
        body = {"type": "or", "elements": [content, _calls(spec, tools, True, single, excludes)]}
    if spec.reasoning and spec.reasoning_start and request.allow_reasoning:
        body = _seq(_reasoning_prefix(spec, excludes), body)
    return {"type": "structural_tag", "format": body}
