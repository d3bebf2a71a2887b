"""Checks behind `chat_constraint_request_from_openai`: JSON schema copies, `tools`, `tool_choice`.

Every function here either returns a normalised value or raises `RequestError` whose `param`
is the OpenAI-style path of the offending field (`tools[2].function.parameters`,
`tool_choice.allowed_tools.tools[0].function.name`). A request field set to null reads as
missing; values inside a JSON schema are copied verbatim (`"default": null` means something).
Bounds (how many tools, how deep a schema) are arguments: `jaxchat.api.Limits` states them.
Pure stdlib: this module is imported by `jaxchat.chat`, which must load without jax or numpy.
"""

from __future__ import annotations

from jaxchat.chat.errors import RequestError, expect_bool, expect_items, expect_name, expect_object, got

TOOL_CHOICE_MODES = ("none", "auto", "required")


def copy_schema(value: object, param: str, max_depth: int | None) -> dict:
    """Deep-copy a JSON schema object, checking it holds only JSON values and nests at most `max_depth`
    containers (None: as deep as Python's recursion allows)."""
    if not isinstance(value, dict):
        raise RequestError(param, f"expected a JSON schema object, got {got(value)}")
    try:
        return _copy_json(value, param, 1, max_depth)
    except RecursionError:
        raise RequestError(param, "schema is nested too deeply") from None


def _copy_json(value: object, param: str, depth: int, max_depth: int | None) -> object:
    if isinstance(value, (dict, list, tuple)):
        if max_depth is not None and depth > max_depth:
            raise RequestError(
                param, f"schema is nested too deeply: more than {max_depth} levels of objects and arrays"
            )
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if not isinstance(key, str):
                    raise RequestError(param, f"schema keys must be strings, got {got(key)}")
                out[key] = _copy_json(item, param, depth + 1, max_depth)
            return out
        return [_copy_json(item, param, depth + 1, max_depth) for item in value]
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise RequestError(param, f"schema must hold only JSON values, got {got(value)}")


def parse_tools(raw: object, max_tools: int | None, max_schema_depth: int | None) -> tuple[dict, ...]:
    """`tools` → normalised `{"type": "function", "function": {name, description, parameters, strict}}`;
    at most `max_tools` of them (None: no bound)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RequestError("tools", f"expected an array of tool objects, got {got(raw)}")
    if max_tools is not None and len(raw) > max_tools:
        raise RequestError("tools", f"at most {max_tools} tools are allowed, got {len(raw)}")
    seen: dict[str, int] = {}
    out = []
    for i, tool in enumerate(raw):
        p = f"tools[{i}]"
        expect_object(tool, p, "a tool object")
        kind = tool.get("type")
        if kind == "custom":
            out.append(_parse_custom(tool, p, seen, i))
            continue
        if kind is not None and kind != "function":
            raise RequestError(f"{p}.type", f"expected a 'function' or 'custom' tool, got {got(kind)}")
        fn, name, description = _definition(tool, p, "function", "function", seen, i)
        out.append(
            {
                "type": "function",
                "function": {
                    "name": name,
                    "description": description,
                    "parameters": _parse_parameters(fn.get("parameters"), f"{p}.function.parameters", max_schema_depth),
                    "strict": expect_bool(fn.get("strict"), f"{p}.function.strict", False),
                },
            }
        )
    return tuple(out)


def _definition(tool: dict, p: str, key: str, what: str, seen: dict[str, int], i: int) -> tuple[dict, str, str]:
    """`tools[i]`'s definition object `tool[key]` ("function" or "custom"; `what` names it in messages), its name
    (unique among the tools so far: `seen` maps names to indexes) and its description ("" when absent)."""
    body = tool.get(key)
    if body is None:
        raise RequestError(f"{p}.{key}", f"missing required field: the {what} definition")
    expect_object(body, f"{p}.{key}", f"a {what} definition object")
    name = expect_name(body.get("name"), f"{p}.{key}.name", f"{what} name")
    if name in seen:
        raise RequestError(f"{p}.{key}.name", f"duplicate {what} name {name!r}: tools[{seen[name]}] already defines it")
    seen[name] = i
    description = body.get("description")
    if description is None:
        description = ""
    elif not isinstance(description, str):
        raise RequestError(f"{p}.{key}.description", f"expected a string, got {got(description)}")
    return body, name, description


CUSTOM_SYNTAXES = ("lark", "regex")


def custom_input_schema(description: str) -> dict:
    """The parameters a custom tool is shown to the model with: its input as one string."""
    return {"type": "object", "properties": {"input": {"type": "string", "description": description}},
            "required": ["input"], "additionalProperties": False}


def custom_format(tool: dict) -> tuple[str, str] | None:
    """A normalised tool's custom input format: ("text", "") / ("lark" | "regex", definition); None for a
    function tool."""
    custom = tool.get("custom")
    return None if custom is None else (custom["syntax"], custom["definition"])


def _parse_custom(tool: dict, p: str, seen: dict[str, int], i: int) -> dict:
    """An OpenAI custom tool `{"type": "custom", "custom": {name, description, format}}` as a function tool whose
    one string parameter `input` carries the input, marked `"custom": {"syntax", "definition"}`."""
    custom, name, description = _definition(tool, p, "custom", "custom tool", seen, i)
    syntax, definition = "text", ""
    fmt = custom.get("format")
    if fmt is not None:
        expect_object(fmt, f"{p}.custom.format", "an object like {'type': 'text'}")
        kind = fmt.get("type")
        if kind == "grammar":
            grammar = fmt.get("grammar")
            expect_object(grammar, f"{p}.custom.format.grammar", "an object with 'syntax' and 'definition'")
            syntax, definition = grammar.get("syntax"), grammar.get("definition")
            if syntax not in CUSTOM_SYNTAXES:
                raise RequestError(f"{p}.custom.format.grammar.syntax", f"expected 'lark' or 'regex', got {got(syntax)}")
            if not isinstance(definition, str) or not definition.strip():
                raise RequestError(f"{p}.custom.format.grammar.definition",
                                   f"expected the grammar as a non-empty string, got {got(definition)}")
        elif kind != "text":
            raise RequestError(f"{p}.custom.format.type", f"expected 'text' or 'grammar', got {got(kind)}")
    shown = {"text": "free text", "lark": f"text of this Lark grammar:\n{definition}",
             "regex": f"text matching this regex: {definition}"}[syntax]
    return {"type": "function",
            "function": {"name": name, "description": description, "parameters": custom_input_schema(shown),
                         "strict": False},
            "custom": {"syntax": syntax, "definition": definition}}


def _parse_parameters(raw: object, param: str, max_schema_depth: int | None) -> dict:
    if raw is None:
        return {"type": "object", "properties": {}}
    schema = copy_schema(raw, param, max_schema_depth)
    kind = schema.get("type")
    if kind is not None and kind != "object":
        raise RequestError(param, f"function parameters must be a JSON schema of type 'object', got type {got(kind)}")
    props = schema.get("properties")
    if props is not None and not isinstance(props, dict):
        raise RequestError(f"{param}.properties", f"expected an object mapping names to schemas, got {got(props)}")
    required = schema.get("required")
    if required is not None and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        raise RequestError(f"{param}.required", "expected an array of property names (strings)")
    return schema


def parse_tool_choice(raw: object, names: tuple[str, ...]) -> tuple[str, tuple[str, ...], str | None]:
    """`tool_choice` → (mode, allowed tool names, named tool or None), given the declared tool names."""
    if raw is None:
        return ("auto", names, None) if names else ("none", (), None)
    if isinstance(raw, str):
        if raw not in TOOL_CHOICE_MODES:
            raise RequestError(
                "tool_choice", f"expected 'none', 'auto', 'required' or a tool choice object, got {got(raw)}"
            )
        if raw == "required" and not names:
            raise RequestError("tool_choice", "tool_choice 'required' needs at least one tool in 'tools'")
        if raw == "none" or not names:  # "auto" with no tools has nothing to call
            return "none", (), None
        return raw, names, None
    if not isinstance(raw, dict):
        raise RequestError(
            "tool_choice", f"expected 'none', 'auto', 'required' or a tool choice object, got {got(raw)}"
        )
    kind = raw.get("type")
    if kind is None:  # tolerate a missing type when the shape says which form it is
        if raw.get("function") is not None:
            kind = "function"
        elif raw.get("allowed_tools") is not None:
            kind = "allowed_tools"
        else:
            raise RequestError("tool_choice.type", "missing required field: 'function' or 'allowed_tools'")
    if kind not in ("function", "allowed_tools", "custom"):
        raise RequestError("tool_choice.type", f"expected 'function', 'custom' or 'allowed_tools', got {got(kind)}")
    if not names:
        raise RequestError("tool_choice", f"a tool_choice of type {kind!r} needs at least one tool in 'tools'")
    if kind in ("function", "custom"):
        name = _tool_ref_name(raw, "tool_choice", names)
        return "required", (name,), name
    allowed = raw.get("allowed_tools")
    if allowed is None:
        raise RequestError("tool_choice.allowed_tools", "missing required field: the allowed_tools object")
    expect_object(allowed, "tool_choice.allowed_tools", "an object with 'mode' and 'tools'")
    mode = allowed.get("mode")
    if mode is None:
        raise RequestError("tool_choice.allowed_tools.mode", "missing required field: 'auto' or 'required'")
    if mode not in ("auto", "required"):
        raise RequestError("tool_choice.allowed_tools.mode", f"expected 'auto' or 'required', got {got(mode)}")
    refs = expect_items(allowed.get("tools"), "tool_choice.allowed_tools.tools", "tool references")
    picked: list[str] = []
    for i, ref in enumerate(refs):
        name = _tool_ref_name(ref, f"tool_choice.allowed_tools.tools[{i}]", names)
        if name not in picked:
            picked.append(name)
    return mode, tuple(picked), None


def _tool_ref_name(ref: object, p: str, names: tuple[str, ...]) -> str:
    """The name in `{"type": "function", "function": {"name": N}}` (or the flat `{"type": "function", "name": N}`)."""
    expect_object(ref, p, "a tool reference object like {'type': 'function', 'function': {'name': ...}}")
    kind = ref.get("type")
    if kind is not None and kind not in ("function", "custom"):
        raise RequestError(f"{p}.type", f"expected a 'function' or 'custom' tool reference, got {got(kind)}")
    fn = ref.get("custom" if kind == "custom" else "function")
    if fn is None and ref.get("name") is not None:
        name, param = ref["name"], f"{p}.name"
    elif fn is None:
        raise RequestError(f"{p}.function", "missing required field: an object with the function name")
    else:
        expect_object(fn, f"{p}.function", "an object with the function name")
        name, param = fn.get("name"), f"{p}.function.name"
    if name is None:
        raise RequestError(param, "missing required field: the function name")
    if not isinstance(name, str):
        raise RequestError(param, f"expected the function name as a string, got {got(name)}")
    if name not in names:
        known = ", ".join(repr(n) for n in names[:8]) + (", ..." if len(names) > 8 else "")
        raise RequestError(param, f"unknown function {name!r}: it is not among the declared tools ({known})")
    return name
