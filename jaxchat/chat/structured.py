"""Read the structured-output fields peers' clients send into one typed `OutputConstraint`.

Contract
--------
`read_output_constraint(body, max_schema_depth=None) -> OutputConstraint | None` reads, from a decoded
request body (Chat Completions or Completions), every field that asks for the output to follow a regex,
one of a list of strings, a grammar or a JSON schema:

| field                                    | from      | kind    |
| ---------------------------------------- | --------- | ------- |
| `structured_outputs.regex`               | vLLM      | regex   |
| `structured_outputs.choice`              | vLLM      | choice  |
| `structured_outputs.grammar`             | vLLM      | grammar |
| `structured_outputs.json`                | vLLM      | json    |
| `structured_outputs.json_object` (true)  | vLLM      | json    |
| `guided_regex` / `guided_choice` / `guided_grammar` / `guided_json` | vLLM (older) | as named |
| `regex`, `ebnf`, `json_schema` (string)  | SGLang    | regex, grammar, json |
| `grammar` (GBNF), `json_schema` (object) | llama.cpp | grammar, json |

and returns None when none is set. Two of them set is a `RequestError` naming both; so is anything it
cannot honour (`structured_outputs.structural_tag`, `guided_whitespace_pattern`, an unknown key of
`structured_outputs`). A regex or grammar must be a non-empty string, a choice a non-empty array of strings
(repeats dropped), a schema a JSON object (a JSON string of one for SGLang's `json_schema` and vLLM's `json`).
`guided_decoding_backend` and `structured_outputs.backend` choose an implementation and are accepted as
strings (jaxchat has one: xgrammar). Whether the regex or grammar compiles is `jaxchat.constrain`'s to say
(a 400 naming `OutputConstraint.param`). Stdlib only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from jaxchat.chat.errors import RequestError, expect_object, got
from jaxchat.chat.request_tools import copy_schema

__all__ = ["OUTPUT_FIELDS", "OutputConstraint", "read_output_constraint"]

OUTPUT_KINDS = ("regex", "choice", "grammar", "json")
# top-level field -> kind ("json_schema" is SGLang's string or llama.cpp's object)
OUTPUT_FIELDS = {
    "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar", "guided_json": "json",
    "regex": "regex", "ebnf": "grammar", "grammar": "grammar", "json_schema": "json",
}
_STRUCTURED_KEYS = {"regex": "regex", "choice": "choice", "grammar": "grammar", "json": "json",
                    "json_object": "json"}
_UNSUPPORTED = {
    "structured_outputs.structural_tag": "structural tags are not supported; use tools or a grammar",
    "structured_outputs.whitespace_pattern": "a custom whitespace pattern is not supported",
    "guided_whitespace_pattern": "a custom whitespace pattern is not supported",
}
_BACKENDS = ("guided_decoding_backend", "structured_outputs.backend")


@dataclass(frozen=True)
class OutputConstraint:
    """What the output must be. `kind` is "regex" (`text` the pattern), "choice" (`choices`, exactly one of
    them), "grammar" (`text` an EBNF/GBNF grammar with a `root` rule) or "json" (`schema`); `param` is the
    request field it came from, the one a 400 about it names."""

    kind: str
    param: str
    text: str = ""
    choices: tuple[str, ...] = ()
    schema: dict | None = None


def _entries(body: dict) -> list[tuple[str, str, object]]:
    """(param, kind, value) of every output field set in `body`."""
    found = [(name, kind, body[name]) for name, kind in OUTPUT_FIELDS.items() if body.get(name) is not None]
    so = body.get("structured_outputs")
    if so is not None:
        expect_object(so, "structured_outputs", "an object like {'regex': '[0-9]+'}")
        for key, value in so.items():
            param = f"structured_outputs.{key}"
            if value is None or (key == "json_object" and value is False):
                continue
            if param in _UNSUPPORTED:
                raise RequestError(param, _UNSUPPORTED[param])
            if param in _BACKENDS:
                continue
            if key not in _STRUCTURED_KEYS:
                known = ", ".join(sorted(_STRUCTURED_KEYS))
                raise RequestError(param, f"unknown structured_outputs field {key!r} (supported: {known})")
            found.append((param, _STRUCTURED_KEYS[key], value))
    for name in _BACKENDS[:1]:
        if body.get(name) is not None and not isinstance(body[name], str):
            raise RequestError(name, f"expected a string, got {got(body[name])}")
    for name, why in _UNSUPPORTED.items():
        if "." not in name and body.get(name) is not None:
            raise RequestError(name, why)
    return found


def read_output_constraint(body: dict, max_schema_depth: int | None = None) -> OutputConstraint | None:
    found = _entries(body)
    if not found:
        return None
    if len(found) > 1:
        a, b = found[0][0], found[1][0]
        raise RequestError(b, f"{a} and {b} both constrain the output; send at most one of them")
    param, kind, value = found[0]
    if kind in ("regex", "grammar"):
        if not isinstance(value, str):
            raise RequestError(param, f"expected the {kind} as a string, got {got(value)}")
        if not value.strip():
            raise RequestError(param, f"the {kind} must not be empty")
        return OutputConstraint(kind, param, text=value)
    if kind == "choice":
        if not isinstance(value, list):
            raise RequestError(param, f"expected an array of strings, got {got(value)}")
        if not value:
            raise RequestError(param, "the choices must not be empty: give at least one string")
        for i, item in enumerate(value):
            if not isinstance(item, str):
                raise RequestError(f"{param}[{i}]", f"expected a string, got {got(item)}")
        return OutputConstraint(kind, param, choices=tuple(dict.fromkeys(value)))
    if param == "structured_outputs.json_object":
        if value is not True:
            raise RequestError(param, f"expected true, got {got(value)}")
        return OutputConstraint("json", param, schema={"type": "object"})
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RequestError(param, f"expected a JSON schema (an object or its JSON text): {exc}") from None
    return OutputConstraint("json", param, schema=copy_schema(value, param, max_schema_depth))
