"""Grammar–parser agreement on call envelopes, by seeded random walks biased towards writing them.

The walks of `test_walk.py` (same walk, same checks: every call the parser reads is a call the request
allows, with arguments that validate) for the JSON-call kinds under tool_choice "auto", "auto" with
parallel_tool_calls false, and "auto" narrowed by allowed_tools, with the envelope openings the models
write added to the walk's markers: a fence, a bare object or an array at a line start, each up to a
declared tool's name key (`"name": "NAME"`, pretty-printed or compact). The grammar takes the rest of
such a call, or refuses the opening (a tool the request may not call). `JAXCHAT_WALKS` sets the walks
per combination as in `test_walk.py` (CI 4, acceptance 200); each format's walks must read at least
one envelope call in all (the bias reaches them).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from jaxchat.chat import (
    ChatParseOptions,
    call_envelopes_on,
    chat_constraint_request_from_openai,
    chat_format_make,
    chat_format_prefill,
    chat_parse,
)
from tests.constrain.support import TOOLS, closing_sequences, make_request, marker_sequences, output_text, walk
from tests.constrain.test_walk import MAX_STEPS, WALKS, check

FORMATS = [
    ("hermes_json", False, "qwen25"),
    ("hermes_json", True, "qwen3"),
    ("llama3_json", False, "qwen25_markers"),
    ("llama3_json:semicolon", False, "qwen25_markers"),
    ("mistral:json_array", False, "qwen25_markers"),
]
MODES = ("auto", "auto_single", "allowed_auto")
ALLOWED_AUTO = {"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
    {"type": "function", "function": {"name": "get_weather"}}, {"type": "function", "function": {"name": "search"}}]}}}
OPENINGS = ("```json\n{{\"name\": \"{}\"", "\n```json\n{{\n  \"name\": \"{}\"", "\n```\n[\n  {{\"name\":\"{}\"",
            "\n{{\"name\": \"{}\"", "\n[{{\"name\": \"{}\"", "\n\n{{\n    \"name\": \"{}\"")
ENVELOPE_CALLS: dict[str, int] = {}


def _request(mode: str, think: bool):
    if mode != "allowed_auto":
        return make_request(mode, reasoning=think)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, **ALLOWED_AUTO}
    if not think:
        body["reasoning_effort"] = "none"
    return chat_constraint_request_from_openai(body)


def _cases():
    for kind, reasoning, vocab in FORMATS:
        for mode in MODES:
            for think in ((True, False) if reasoning else (True,)):
                yield pytest.param(kind, reasoning, vocab, mode, think, id=f"{kind}-{vocab}-{mode}-think{int(think)}")


@pytest.mark.slow
@pytest.mark.parametrize("kind,reasoning,vocab_name,mode,think", list(_cases()))
def test_walk_envelopes_agree_with_parser(vocab, kind, reasoning, vocab_name, mode, think):
    name, _, variant = kind.partition(":")
    spec = chat_format_make(name, reasoning=reasoning, variant=variant)
    request = _request(mode, think)
    assert call_envelopes_on(spec, request)
    v = vocab(vocab_name)
    prefill = chat_format_prefill(spec, "<|im_start|>assistant\n")
    openings = [v.encode(o.format(t["function"]["name"])) for o in OPENINGS for t in TOOLS]
    markers = marker_sequences(v, spec) + openings
    closing = closing_sequences(v, spec) + [v.encode("\n```")]
    end = v.encode(spec.reasoning_end) if spec.reasoning_end else None
    seed = zlib.crc32(repr(("envelopes", kind, reasoning, mode, think)).encode()) & 0xFFFF
    failures = []
    for i in range(WALKS):
        constraint = v.engine.make(spec, request, prefill)
        jump_after = v.encode(prefill or "\n")[-1] if i % 2 else None
        ids, finished = walk(v, constraint, markers, np.random.default_rng(seed + i), MAX_STEPS, end, closing,
                             jump_after)
        assert not constraint.disabled, constraint.given_up_reason
        full = prefill + output_text(v, ids)
        problems = check(spec, request, full, finished)
        if problems:
            failures.append((i, full, problems))
        on = chat_parse(spec, full, False, ChatParseOptions(tools=request.tools, call_envelopes=True))
        off = chat_parse(spec, full, False, ChatParseOptions(tools=request.tools))
        ENVELOPE_CALLS[kind] = ENVELOPE_CALLS.get(kind, 0) + len(on.tool_calls) - len(off.tool_calls)
    assert not failures, "\n".join(f"walk {i}: {p}\n  text={t!r}" for i, t, p in failures[:5])


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted({f[0] for f in FORMATS}))
def test_walks_read_envelope_calls(kind):
    """Runs after the walks above (same module): the bias does reach envelope calls in every format."""
    if kind not in ENVELOPE_CALLS:
        pytest.skip("the walks of this format did not run")
    assert ENVELOPE_CALLS[kind] > 0
