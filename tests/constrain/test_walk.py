"""Grammar–parser agreement by seeded random walks (see `support.walk` for the stated bias).

For each format x tool_choice mode x response_format (x reasoning on/off where the format reasons),
every walk's text must parse with `chat_parse` (call envelopes read where the service reads them)
into calls whose names satisfy the mode and whose arguments validate against the tool's schema (no
key twice), and into JSON content that validates under json_object / json_schema. `JAXCHAT_WALKS` sets the walks per combination (CI default 4, every
combination covered, the whole tests/constrain directory in about 2 minutes on 2 cores; the
acceptance run uses 200). Seeds are a CRC of the combination, so a failure reproduces. Every odd walk
jumps forward as the engine does (`jaxchat.engine.jump_forward`): the text the grammar forces is taken
whole, tokenised as the tokenizer spells it, so jump-forward's outputs are held to the same checks.
`test_walks_write_arguments_in_any_order` checks that the walks do write a named call's arguments
in orders other than the declared one (the tools' properties may come in any order).
"""

from __future__ import annotations

import json
import os
import zlib

import jsonschema
import numpy as np
import pytest

from jaxchat.chat import ChatParseOptions, call_envelopes_on, chat_format_make, chat_format_prefill, chat_parse
from jaxchat.constrain import chat_structural_tag
from tests.constrain.support import SCHEMA, closing_sequences, make_request, marker_sequences, output_text, walk

WALKS = int(os.environ.get("JAXCHAT_WALKS", "4"))
MAX_STEPS = 400

# (format kind[:variant], reasoning known, vocabulary)
FORMATS = [
    ("hermes_json", False, "qwen25"),
    ("hermes_json", True, "qwen3"),
    ("qwen_xml", True, "qwen3"),
    ("lfm2", False, "qwen25"),
    ("lfm2", True, "qwen3"),
    ("gemma4", True, "qwen25"),
    ("harmony", True, "harmony"),
    ("plain", False, "qwen25"),
    ("llama3_json", False, "qwen25_markers"),
    ("llama3_json:semicolon", False, "qwen25_markers"),
    ("mistral", True, "qwen25_markers"),
    ("mistral:json_array", False, "qwen25_markers"),
    ("deepseek_v3", True, "qwen25_markers"),
    ("deepseek_v3:v3_1", True, "qwen25_markers"),
]
COMBOS = [
    (mode, rf)
    for mode in ("auto", "required", "named", "allowed", "none", "auto_single", "required_single")
    for rf in ("text", "json_object", "json_schema", "json_schema_strict")
    if rf == "text" or mode in ("auto", "none") and (rf != "json_schema_strict" or mode == "none")
]


def _cases():
    for kind, reasoning, vocab in FORMATS:
        for mode, rf in COMBOS:
            for think in ((True, False) if reasoning else (True,)):
                if kind == "plain" and mode not in ("none", "auto"):
                    continue
                yield pytest.param(kind, reasoning, vocab, mode, rf, think, id=f"{kind}-{vocab}-{mode}-{rf}-think{int(think)}")


def _unique_keys(pairs: list) -> dict:
    """`json.loads` hook: a repeated key is an error (json.loads would keep the last one silently)."""
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"repeated key in {keys}")
    return dict(pairs)


def check(spec, request, text: str, finished: bool) -> list[str]:
    """Problems with one walk's output; [] when it agrees with the request. The output is read as the
    service reads it: call envelopes too where `call_envelopes_on` says so."""
    parse_calls = request.tool_choice != "none" and bool(request.tools) and spec.has_tools
    options = ChatParseOptions(parse_tool_calls=parse_calls, tools=request.tools,
                               call_envelopes=call_envelopes_on(spec, request))
    msg = chat_parse(spec, text, not finished, options)
    problems = []
    calls = msg.tool_calls
    allowed = {t["function"]["name"]: t["function"]["parameters"] for t in request.callable_tools}
    if not spec.has_tools:
        allowed = {}
    if not finished:
        return [f"walk did not finish in {MAX_STEPS} steps"]
    if request.tool_choice == "required" and allowed and not calls:
        problems.append("no tool call under required")
    if not request.parallel_tool_calls and len(calls) > 1:
        problems.append(f"{len(calls)} calls under parallel_tool_calls=false")
    for call in calls:
        if call.name not in allowed:
            problems.append(f"call of {call.name!r} not allowed")
            continue
        try:
            jsonschema.validate(json.loads(call.arguments, object_pairs_hook=_unique_keys), allowed[call.name])
        except (ValueError, jsonschema.ValidationError) as e:
            problems.append(f"arguments of {call.name} {call.arguments!r}: {str(e)[:200]}")
    if request.response_format != "text" and not calls:
        schema = SCHEMA if request.response_format == "json_schema" else {"type": "object"}
        try:
            jsonschema.validate(json.loads(msg.content), schema)
        except (ValueError, jsonschema.ValidationError) as e:
            problems.append(f"content {msg.content!r}: {str(e)[:200]}")
    return problems


@pytest.mark.slow
@pytest.mark.parametrize("kind,reasoning,vocab_name,mode,rf,think", list(_cases()))
def test_walk_agrees_with_parser(vocab, kind, reasoning, vocab_name, mode, rf, think):
    name, _, variant = kind.partition(":")
    spec = chat_format_make(name, reasoning=reasoning, variant=variant)
    request = make_request(mode, rf, reasoning=think, tools=kind != "plain" or mode != "none")
    if kind == "plain" and mode == "auto":
        request = make_request("none", rf, reasoning=think)
    if chat_structural_tag(spec, request) is None:
        pytest.skip("nothing to constrain")
    v = vocab(vocab_name)
    prefill = "assistant" if kind == "harmony" else chat_format_prefill(spec, "<|im_start|>assistant\n")
    markers = marker_sequences(v, spec)
    failures = []
    closing = closing_sequences(v, spec)
    seed = zlib.crc32(repr((kind, reasoning, mode, rf, think)).encode()) & 0xFFFF  # stable across runs
    for i in range(WALKS):
        constraint = v.engine.make(spec, request, prefill)
        end = v.encode(spec.reasoning_end) if spec.reasoning_end else None
        jump_after = v.encode(prefill or "\n")[-1] if i % 2 else None  # odd walks jump forward as the engine does
        ids, finished = walk(v, constraint, markers, np.random.default_rng(seed + i), MAX_STEPS, end, closing,
                             jump_after)
        assert not constraint.disabled, constraint.given_up_reason
        text = output_text(v, ids)
        full = ("" if kind == "harmony" else prefill) + text
        problems = check(spec, request, full, finished)
        if problems:
            failures.append((i, full, problems))
    assert not failures, "\n".join(f"walk {i}: {p}\n  text={t!r}" for i, t, p in failures[:5])


ORDER_WALKS = 4


def _walk_text(v, spec, request, prefill: str, seed: int) -> tuple[str, bool]:
    """One seeded walk: (prefill + generated text as the parser reads it, finished)."""
    constraint = v.engine.make(spec, request, prefill)
    end = v.encode(spec.reasoning_end) if spec.reasoning_end else None
    ids, finished = walk(v, constraint, marker_sequences(v, spec), np.random.default_rng(seed), MAX_STEPS, end,
                         closing_sequences(v, spec))
    assert not constraint.disabled, constraint.given_up_reason
    return ("" if spec.kind == "harmony" else prefill) + output_text(v, ids), finished


def _prefill(spec) -> str:
    return "assistant" if spec.kind == "harmony" else chat_format_prefill(spec, "<|im_start|>assistant\n")


@pytest.mark.slow
@pytest.mark.parametrize("kind,reasoning,vocab_name", [f for f in FORMATS if f[0] != "plain"],
                         ids=[f"{k}-{v}" for k, _, v in FORMATS if k != "plain"])
def test_walks_write_arguments_in_any_order(vocab, kind, reasoning, vocab_name):
    """Named `search` (query and score required, tags optional): the walks agree with the parser and
    write its arguments in some order other than the declared one."""
    name, _, variant = kind.partition(":")
    spec = chat_format_make(name, reasoning=reasoning, variant=variant)
    request = make_request("named", reasoning=False)
    declared = list(request.callable_tools[0]["function"]["parameters"]["properties"])
    v = vocab(vocab_name)
    orders = []
    for i in range(ORDER_WALKS):
        full, finished = _walk_text(v, spec, request, _prefill(spec), zlib.crc32(kind.encode()) + i)
        assert not check(spec, request, full, finished), full
        msg = chat_parse(spec, full, False, ChatParseOptions(tools=request.tools))
        orders += [list(json.loads(call.arguments)) for call in msg.tool_calls]
    assert any(keys != [k for k in declared if k in keys] for keys in orders), orders
