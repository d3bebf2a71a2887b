"""A custom tool call's input streamed: the pieces `CustomInput` / `CustomCalls` / the Responses writer send
concatenate to the non-streamed input, for any split of the arguments, cut arguments and escapes split in half;
through the real stream parser of each format that carries custom tools, the input arrives in several pieces."""

from __future__ import annotations

import json
import random

import pytest

from jaxchat.api.custom_input import CustomInput, custom_input
from jaxchat.api.openai.custom_calls import CustomCalls
from jaxchat.api.responses.shapes import ResponseWriter
from jaxchat.chat import ChatStream, chat_constraint_request_from_openai, chat_format_make
from jaxchat.chat.msg import ChatParseOptions

INPUTS = ['ls "dir"\\', "a\u0001\b\f\n\t<|x|> 'q' é 😀 end", "", 'say "hi"\nthen {x: 1}, ok']


@pytest.mark.parametrize("text", INPUTS)
def test_any_split_of_the_arguments_gives_the_input(text):
    rng = random.Random(0)
    for arguments in (json.dumps({"input": text}, ensure_ascii=False), json.dumps({"input": text})):
        assert custom_input(arguments) == text
        for _ in range(100):
            reader, pieces, at = CustomInput(), [], 0
            while at < len(arguments):
                step = rng.randint(1, 5)
                pieces.append(reader.feed(arguments[at:at + step]))
                at += step
            pieces.append(reader.finish())
            assert "".join(pieces) == text


def test_escapes_and_surrogate_pairs_split_anywhere():
    arguments = '{"input": "\\ud83d\\ude00x\\u0001\\n\\""}'
    assert custom_input(arguments) == '😀x\x01\n"'
    for k in range(1, len(arguments)):
        reader = CustomInput()
        assert reader.feed(arguments[:k]) + reader.feed(arguments[k:]) + reader.finish() == custom_input(arguments)


def test_cut_and_other_arguments():
    assert custom_input('{"input": "ab\\ncd') == "ab\ncd"  # a cut call keeps the input written so far
    assert custom_input('{"input": "ab\\') == "ab"
    assert custom_input('{ "input" : "y"}') == "y"  # not the canonical spelling: read as JSON, sent at the end
    assert custom_input('{"x": 1}') == '{"x": 1}'
    for arguments in ('{"input": "ab\\ncd', '{ "input" : "y"}', '{"x": 1}', "free text"):
        reader = CustomInput()
        assert reader.feed(arguments) + reader.finish() == custom_input(arguments)


def _call_text(spec, name: str, text: str) -> str:
    if spec.kind == "qwen_xml":
        return f"{spec.tool_start}\n<function={name}>\n<parameter=input>\n{text}\n</parameter>\n</function>\n{spec.tool_end}"
    if spec.kind == "gemma4":
        return f'{spec.tool_start}call:{name}{{input:<|"|>{text}<|"|>}}{spec.tool_end}'
    if spec.kind == "lfm2":
        return f"{spec.tool_start}[{name}(input={json.dumps(text, ensure_ascii=False)})]{spec.tool_end}"
    return f'{spec.tool_start}\n{{"name": "{name}", "arguments": {json.dumps({"input": text}, ensure_ascii=False)}}}\n{spec.tool_end}'


@pytest.mark.parametrize("kind", ["hermes_json", "qwen_xml", "gemma4", "lfm2"])
def test_streamed_through_the_parser_in_pieces(kind):
    spec = chat_format_make(kind)
    body = {"tools": [{"type": "custom", "custom": {"name": "sh"}},
                      {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}
    tools = chat_constraint_request_from_openai(body).tools
    text = 'echo "one two three"\nand four'
    reply = "Sure. " + _call_text(spec, "sh", text)
    parser = ChatStream(spec, ChatParseOptions(parse_tool_calls=True, tools=tools))
    calls, writer = CustomCalls(frozenset({"sh"})), ResponseWriter("m", {}, frozenset({"sh"}))
    chunks, events = [], []
    for at in range(0, len(reply), 3):
        deltas = parser.update(reply[at:at + 3], at + 3 >= len(reply))
        chunks += calls.pass_through(0, deltas)
        events += writer.feed(deltas)
    chunks += calls.finish(0)
    events += writer.finish("tool_calls", {})
    parts = [c["tool_calls"][0] for c in chunks if "tool_calls" in c]
    assert parts[0]["type"] == "custom" and parts[0]["custom"]["name"] == "sh" and "id" in parts[0]
    assert "".join(p["custom"]["input"] for p in parts) == text
    assert len([p for p in parts if p["custom"]["input"]]) > 3  # streamed, not one piece at the end
    assert "".join(c.get("content") or "" for c in chunks).strip() == "Sure."
    pieces = [e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    assert "".join(pieces) == text and len(pieces) > 3
    (done,) = [e for e in events if e["type"] == "response.custom_tool_call_input.done"]
    assert done["input"] == text and writer.response["output"][-1]["input"] == text
