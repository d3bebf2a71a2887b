"""The inline-call parser (llama3_json, mistral): where calls start and end without a closing marker.

The golden transcripts (tests/chat/golden.py) cover whole turns at every split; these are the edges.
"""

from __future__ import annotations

from jaxchat.chat import ChatParseOptions, chat_format_make, chat_parse

LLAMA = chat_format_make("llama3_json")
LLAMA_THINK = chat_format_make("llama3_json", reasoning=True)
MISTRAL = chat_format_make("mistral", reasoning=True)
CALL = '{"name": "get_time", "parameters": {}}'
NO_TOOLS = ChatParseOptions(parse_tool_calls=False)


def _calls(msg):
    return [(c.name, c.arguments) for c in msg.tool_calls]


def test_semicolon_is_held_until_the_next_call_or_text():
    partial = chat_parse(LLAMA, CALL + " ;  ", True)
    assert (partial.content, _calls(partial)) == ("", [("get_time", "{}")])
    assert chat_parse(LLAMA, CALL + " ;  ", False).content == ";"
    assert chat_parse(LLAMA, CALL + ";" + CALL, False).tool_calls[1].name == "get_time"
    assert chat_parse(LLAMA, CALL + " ; next", True).content == "; next"


def test_bare_call_only_opens_the_content():
    assert _calls(chat_parse(LLAMA, "\n\n  " + CALL, False)) == [("get_time", "{}")]
    assert chat_parse(LLAMA, "x " + CALL, False).tool_calls == []
    assert chat_parse(LLAMA, CALL + " " + CALL, False).content == CALL  # no `;`: text after the call
    assert _calls(chat_parse(LLAMA_THINK, "<think>Time?</think>\n" + CALL, False)) == [("get_time", "{}")]
    assert chat_parse(LLAMA_THINK, "Hi<think>Time?</think>\n" + CALL, False).tool_calls == []


def test_json_content_streams_once_its_first_key_is_known():
    assert chat_parse(LLAMA, '{"ans', True).content == ""
    assert chat_parse(LLAMA, '{"answer": 4', True).content == '{"answer": 4'
    assert chat_parse(LLAMA, '{"name": "x", "description', True).content == ""
    assert chat_parse(LLAMA, '{"name": "x", "description": "y"}', False).content == '{"name": "x", "description": "y"}'


def test_python_tag_code_is_content_with_its_tag():
    assert chat_parse(LLAMA, "<|python_tag|>", True).content == ""
    assert chat_parse(LLAMA, "<|python_tag|>  ", False).content == "<|python_tag|>"
    msg = chat_parse(LLAMA, "<|python_tag|>import math\nprint(1)<|eom_id|>", True)
    assert msg.content == "<|python_tag|>import math\nprint(1)" and msg.tool_calls == []


def test_mistral_malformed_call_is_content():
    msg = chat_parse(MISTRAL, "[TOOL_CALLS]not a call![TOOL_CALLS]get_time[ARGS]{}</s>", False)
    assert msg.content == "[TOOL_CALLS]not a call!" and _calls(msg) == [("get_time", "{}")]


def test_mistral_stop_inside_arguments_ends_the_turn():
    msg = chat_parse(MISTRAL, '[TOOL_CALLS]get_weather[ARGS]{"city": "Pa</s>ris"}', False)
    assert msg.tool_calls == [] and msg.content == '[TOOL_CALLS]get_weather[ARGS]{"city": "Pa'


def test_without_tool_parsing_calls_are_text():
    assert chat_parse(LLAMA, CALL, False, NO_TOOLS).content == CALL
    msg = chat_parse(MISTRAL, "[THINK]x[/THINK][TOOL_CALLS]get_time[ARGS]{}", False, NO_TOOLS)
    assert (msg.reasoning_content, msg.content) == ("x", "[TOOL_CALLS]get_time[ARGS]{}")
