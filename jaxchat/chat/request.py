"""Turn the constraint-relevant fields of an OpenAI chat request into one checked value.

Contract
--------
`chat_constraint_request_from_openai(body, max_tools=None, max_schema_depth=None)` reads `tools`, `tool_choice`, `parallel_tool_calls`,
`response_format`, `think`, `reasoning_effort`, `chat_template_kwargs` and the structured-output fields
(`jaxchat.chat.structured`: regex, choice, grammar, JSON schema) from a decoded
`/v1/chat/completions` body and returns a frozen `ConstraintRequest`, or raises
`RequestError(param, message)`, which the server answers with HTTP 400. `param` is the path of the
offending field spelled the way the OpenAI API spells it (`tools[3].function.name`,
`tool_choice.allowed_tools.tools[0].function.name`, `response_format.json_schema.schema`); the
message says what was expected and what arrived.

Rules the rest of jaxchat relies on:

* A request field set to null is treated exactly as if it were absent, at every level. Values
  inside a JSON schema are copied verbatim, since `"default": null` there carries meaning.
* Unknown fields are ignored; this function only looks at the fields above.
* The result never aliases the caller's body: schemas and template kwargs are copies.
* `tool_choice` ends up as "none", "auto" or "required". The named form becomes "required"
  with `allowed_tools == (name,)` and `named_tool == name`; the `allowed_tools` form becomes
  its `mode` with `allowed_tools` narrowed to the listed names (in the order given, without
  repeats). Without tools, "auto" (and the default) normalise to "none"; "required", the named
  form and `allowed_tools` are rejected.
* At most one constraint on the output: a structured-output field beside a non-text `response_format`,
  or beside tools that may be called (tool_choice not "none"), is a `RequestError` naming both.
* Reasoning is on unless one switch turns it off: `think: false`, `reasoning_effort: "none"`
  or `chat_template_kwargs.enable_thinking: false`; any off switch wins over any on switch.
  `reasoning_effort` keeps the requested level only while reasoning is allowed.

Only the stdlib is used here: `jaxchat.chat` must import without jax, numpy, xgrammar or starlette.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from jaxchat.chat import request_tools as rt
from jaxchat.chat.errors import RequestError, expect_bool, expect_name, expect_object, got
from jaxchat.chat.structured import OutputConstraint, read_output_constraint

# Levels accepted for `reasoning_effort`; "none" turns reasoning off. The upper three are in the
# installed OpenAI SDK's `ReasoningEffort` too, so a request the SDK builds is never refused.
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")


@dataclass(frozen=True)
class ConstraintRequest:
    # Normalised OpenAI tool objects: {"type": "function", "function": {"name", "description",
    # "parameters" (a JSON-schema object, {"type": "object", "properties": {}} when absent), "strict"}}
    tools: tuple[dict, ...] = ()
    # "none" | "auto" | "required"; the named form is "required" with allowed_tools == (name,)
    tool_choice: str = "auto"
    # names of the tools the model may call (all tools unless allowed_tools / named form narrows them)
    allowed_tools: tuple[str, ...] = ()
    # the function name of the named form {"type": "function", "function": {"name": ...}}, else None
    named_tool: str | None = None
    parallel_tool_calls: bool = True
    # "text" | "json_object" | "json_schema"
    response_format: str = "text"
    json_schema: dict | None = None  # the schema of a json_schema response_format
    json_schema_name: str | None = None
    json_schema_strict: bool = False
    allow_reasoning: bool = True
    # "minimal" | "low" | "medium" | "high" | "xhigh" | "max" | None; always None when allow_reasoning is False
    reasoning_effort: str | None = None
    chat_template_kwargs: dict = field(default_factory=dict)
    json_schema_description: str | None = None  # the description of a json_schema response_format
    # a regex, choice, grammar or JSON schema from the structured-output fields (`jaxchat.chat.structured`)
    output: OutputConstraint | None = None

    @property
    def callable_tools(self) -> tuple[dict, ...]:
        """The tools the model may call under tool_choice / allowed_tools."""
        if self.tool_choice == "none":
            return ()
        names = set(self.allowed_tools)
        return tuple(t for t in self.tools if t["function"]["name"] in names)

    @property
    def tool_names(self) -> tuple[str, ...]:
        """The names of all declared tools, in request order."""
        return tuple(t["function"]["name"] for t in self.tools)


def chat_constraint_request_from_openai(
    body: dict, *, max_tools: int | None = None, max_schema_depth: int | None = None
) -> ConstraintRequest:
    """Validate and normalise an OpenAI chat request body; raise `RequestError` for a 400. The bounds
    come from the caller's `jaxchat.api.Limits` (None: unbounded)."""
    if not isinstance(body, dict):
        raise RequestError(None, f"the request body must be a JSON object, got {got(body)}")
    tools = rt.parse_tools(body.get("tools"), max_tools, max_schema_depth)
    tool_choice, allowed, named = rt.parse_tool_choice(
        body.get("tool_choice"), tuple(t["function"]["name"] for t in tools)
    )
    parallel = expect_bool(body.get("parallel_tool_calls"), "parallel_tool_calls", True)
    fmt, schema, schema_name, schema_strict, schema_description = _parse_response_format(
        body.get("response_format"), max_schema_depth
    )
    allow_reasoning, effort, template_kwargs = _parse_thinking(body)
    output = read_output_constraint(body, max_schema_depth)
    if output is not None:
        other = "response_format" if fmt != "text" else "tools" if tools and tool_choice != "none" else None
        if other is not None:
            raise RequestError(output.param, f"{other} and {output.param} both constrain the output; "
                               "send at most one of them")
    return ConstraintRequest(
        tools=tools,
        tool_choice=tool_choice,
        allowed_tools=allowed,
        named_tool=named,
        parallel_tool_calls=parallel,
        response_format=fmt,
        json_schema=schema,
        json_schema_name=schema_name,
        json_schema_strict=schema_strict,
        json_schema_description=schema_description,
        allow_reasoning=allow_reasoning,
        reasoning_effort=effort,
        chat_template_kwargs=template_kwargs,
        output=output,
    )


def _parse_response_format(
    raw: object, max_schema_depth: int | None
) -> tuple[str, dict | None, str | None, bool, str | None]:
    if raw is None:
        return "text", None, None, False, None
    expect_object(raw, "response_format", "an object like {'type': 'json_object'}")
    kind = raw.get("type")
    if kind is None:
        raise RequestError("response_format.type", "missing required field: 'text', 'json_object' or 'json_schema'")
    if kind not in RESPONSE_FORMAT_TYPES:
        raise RequestError(
            "response_format.type", f"expected 'text', 'json_object' or 'json_schema', got {got(kind)}"
        )
    if kind != "json_schema":
        return kind, None, None, False, None
    spec = raw.get("json_schema")
    if spec is None:
        raise RequestError(
            "response_format.json_schema",
            "missing required field: a response_format of type 'json_schema' needs "
            "a 'json_schema' object with a 'name' and a 'schema'",
        )
    expect_object(spec, "response_format.json_schema", "an object with 'name' and 'schema'")
    name = expect_name(spec.get("name"), "response_format.json_schema.name", "response format name")
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise RequestError("response_format.json_schema.description", f"expected a string, got {got(description)}")
    schema = spec.get("schema")
    schema = {} if schema is None else rt.copy_schema(schema, "response_format.json_schema.schema", max_schema_depth)
    strict = expect_bool(spec.get("strict"), "response_format.json_schema.strict", False)
    return "json_schema", schema, name, strict, description


def _parse_thinking(body: dict) -> tuple[bool, str | None, dict]:
    think = expect_bool(body.get("think"), "think", True)
    effort = body.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        levels = ", ".join(repr(e) for e in REASONING_EFFORTS)
        raise RequestError("reasoning_effort", f"expected one of {levels}, got {got(effort)}")
    raw_kwargs = body.get("chat_template_kwargs")
    if raw_kwargs is None:
        raw_kwargs = {}
    expect_object(raw_kwargs, "chat_template_kwargs", "an object of template variables")
    kwargs = {k: copy.deepcopy(v) for k, v in raw_kwargs.items() if v is not None}
    enable = expect_bool(kwargs.get("enable_thinking"), "chat_template_kwargs.enable_thinking", True)
    allow = think and enable and effort != "none"
    return allow, (effort if allow else None), kwargs
