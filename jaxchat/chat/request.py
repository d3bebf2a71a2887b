"""Validate and normalise the constraint-relevant fields of an OpenAI chat request.

Contract: `chat_constraint_request_from_openai(body)` returns a frozen `ConstraintRequest`
or raises `RequestError(param, message)`; `param` names the field the way the OpenAI API
does (`tools[0].function.name`). A field set to null reads as missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class RequestError(ValueError):
    """A request the server must answer with HTTP 400."""

    def __init__(self, param: str | None, message: str):
        super().__init__(message)
        self.param = param
        self.message = message


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
    reasoning_effort: str | None = None  # "low" | "medium" | "high" | None
    chat_template_kwargs: dict = field(default_factory=dict)

    @property
    def callable_tools(self) -> tuple[dict, ...]:
        """The tools the model may call under tool_choice / allowed_tools."""
        if self.tool_choice == "none":
            return ()
        names = set(self.allowed_tools)
        return tuple(t for t in self.tools if t["function"]["name"] in names)
