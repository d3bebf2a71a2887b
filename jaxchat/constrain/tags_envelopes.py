"""Structural tags for call envelopes: the grammar side of `jaxchat.chat.envelopes`.

Contract: `EnvelopeTools(callable, declared)` holds, for a request whose reply reads envelopes
(`chat.call_envelopes_on`), the callable tools as (name, argument format) pairs built by
`constrain.tags` (the arguments of `arguments_for_envelopes`: the native ones with whitespace runs up
to `ENVELOPE_WS`, as models pretty-print JSON) and the names of every declared tool.
`.formats(single, excludes)` returns the `Envelopes` that the free text of tool_choice "auto" gets:

  - one xgrammar trigger per callable tool and name key of `chat.spec.ENVELOPE_NAME_KEYS`:
    `"name": "NAME"` (and `"name":"NAME"`), the text the parser decides a call on. Wherever it appears
    in free text, the call must go on as one: whitespace, `,`, `"arguments"` or `"parameters"`, `:`,
    the tool's arguments (typed, any order, required present, one object), whitespace and `}`. With
    `single` (parallel_tool_calls false, Llama's single variant) the rest of the turn after that
    `}` is free text in which no call may start (no tool opener, no name key of any declared tool);
  - `forbidden`: the same strings for the declared tools that may not be called (allowed_tools), kept
    out of free text, since the parser reads every declared tool's envelope call.

`add_envelopes(triggered, envelopes)` adds them to a `triggered_tags` format. What the grammar cannot
know is where the parser reads an envelope (a fence or a line start before the `{`): it constrains
every such name key in free text, so a call-shaped object mid-line is a valid call that reads as
content. A call object spelled otherwise (another name key, the name escaped) is free text, and the
parser never reads it as a call.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxchat.chat.spec import ENVELOPE_ARGUMENT_KEYS, ENVELOPE_NAME_KEYS

ENVELOPE_WS = 16
_WS = rf"[ \t\n\r]{{0,{ENVELOPE_WS}}}"
_TO_ARGUMENTS = _WS + "," + _WS + '"(' + "|".join(ENVELOPE_ARGUMENT_KEYS) + ')"' + _WS + ":" + _WS


def heads(name: str) -> list[str]:
    """The strings an envelope call of tool `name` is decided on (the parser's and the triggers)."""
    return [key + name + '"' for key in ENVELOPE_NAME_KEYS]


@dataclass(frozen=True)
class Envelopes:
    triggers: tuple[str, ...]
    tags: tuple[dict, ...]
    forbidden: tuple[str, ...]


@dataclass(frozen=True)
class EnvelopeTools:
    callable: tuple[tuple[str, dict], ...]  # (tool name, argument format)
    declared: tuple[str, ...]

    def formats(self, single: bool, excludes) -> Envelopes:
        names = {name for name, _ in self.callable}
        forbidden = tuple(h for name in self.declared if name not in names for h in heads(name))
        every_head = self.every_head()
        triggers, tags = [], []
        for name, arguments in self.callable:
            for head in heads(name):
                elements = [{"type": "regex", "pattern": _TO_ARGUMENTS}, arguments, {"type": "regex", "pattern": _WS}]
                end = "}"
                if single:  # the call, then free text without calls to the end of the turn
                    elements += [{"type": "const_string", "value": "}"},
                                 {"type": "any_text", "excludes": [*excludes, *every_head]}]
                    end = ""
                triggers.append(head)
                tags.append({"type": "tag", "begin": head, "content": {"type": "sequence", "elements": elements},
                             "end": end})
        return Envelopes(tuple(triggers), tuple(tags), forbidden)

    def every_head(self) -> list[str]:
        """The name keys of every declared tool: free text without envelope calls excludes them."""
        return [h for name in self.declared for h in heads(name)]


def add_envelopes(triggered: dict, envelopes: Envelopes) -> dict:
    """A `triggered_tags` format with the envelope triggers, tags and forbidden heads added."""
    return {**triggered, "triggers": [*triggered["triggers"], *envelopes.triggers],
            "tags": [*triggered["tags"], *envelopes.tags],
            "excludes": [*triggered.get("excludes", []), *envelopes.forbidden]}
