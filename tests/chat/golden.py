"""Golden transcripts: real-shaped model outputs of every format with the message they must parse to.

Each transcript is the prefill plus the generated text of one assistant turn, the spec it is read
with, and the expected reasoning, content and tool calls (arguments as Python values). Other tests
(the grammar's `accepts`, the stream property test) reuse them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from jaxchat.chat.spec import ChatFormatSpec, chat_format_make

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast for a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time", "description": "The time", "parameters": {"type": "object", "properties": {}}}},
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search documents",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "filters": {
                        "type": "object",
                        "properties": {
                            "tags": {"type": "array", "items": {"type": "string"}},
                            "limit": {"type": "integer"},
                            "exact": {"type": "boolean"},
                            "lang": {"type": ["string", "null"]},
                        },
                    },
                },
                "required": ["query"],
            },
        },
    },
)

NESTED_ARGS = {"query": "Zürich 天気 🌤 \"quoted\"", "filters": {"tags": ["a", "b c"], "limit": 5, "exact": True, "lang": None}}
# get_weather's arguments in another order than the schema declares (city, days, unit).
OUT_OF_ORDER_ARGS = {"unit": "f", "days": 3, "city": "Paris"}


@dataclass(frozen=True)
class Golden:
    name: str
    spec: ChatFormatSpec
    prefill: str
    generated: str
    reasoning: str = ""
    content: str = ""
    calls: tuple[tuple[str, dict], ...] = ()
    cut: str = ""  # "reasoning" or "call" when the output ends inside one
    tags: frozenset[str] = field(default_factory=frozenset)

    @property
    def text(self) -> str:
        return self.prefill + self.generated

    @property
    def id(self) -> str:
        kind = f"{self.spec.kind}:{self.spec.variant}" if self.spec.variant else self.spec.kind
        return f"{kind}:{self.name}"


def _g(spec, name, prefill, generated, reasoning="", content="", calls=(), cut="") -> Golden:
    return Golden(name, spec, prefill, generated, reasoning, content, tuple(calls), cut)


def _tag_family(spec: ChatFormatSpec, call, call_block, think_prefill: str) -> list[Golden]:
    """The standard set for a tag format; `call(name, args_src)` renders one call's syntax."""
    r_close = spec.reasoning_end
    weather = call("get_weather", {"city": "Paris", "days": 3})
    return [
        _g(spec, "plain_text", "", "Hello! How can I help you today?", content="Hello! How can I help you today?"),
        _g(spec, "reasoning_text", think_prefill, f"The user greets me.\nI should greet back.\n{r_close}\n\nHello there.",
           reasoning="The user greets me.\nI should greet back.", content="Hello there."),
        _g(spec, "reasoning_one_call", think_prefill, f"Need the weather.\n{r_close}\n\n{call_block([weather])}",
           reasoning="Need the weather.", calls=[("get_weather", {"city": "Paris", "days": 3})]),
        _g(spec, "parallel_calls", "", f"Checking both.\n{call_block([weather, call('get_time', {})])}",
           content="Checking both.", calls=[("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]),
        _g(spec, "empty_arguments", "", call_block([call("get_time", {})]), calls=[("get_time", {})]),
        _g(spec, "nested_unicode", "", call_block([call("search", NESTED_ARGS)]), calls=[("search", NESTED_ARGS)]),
        _g(spec, "arguments_out_of_order", "", call_block([call("get_weather", OUT_OF_ORDER_ARGS)]),
           calls=[("get_weather", OUT_OF_ORDER_ARGS)]),
        _g(spec, "call_inside_reasoning", think_prefill,
           f"Maybe {spec.tool_start}nothing{spec.tool_end} here.\n{r_close}\nThe answer is 4.",
           reasoning=f"Maybe {spec.tool_start}nothing{spec.tool_end} here.", content="The answer is 4."),
        _g(spec, "cut_in_reasoning", think_prefill, "Let me think about the", reasoning="Let me think about the", cut="reasoning"),
        _g(spec, "cut_in_call", "", f"Sure.\n{call_block([weather])[:-len(spec.tool_end) - 6]}",
           content="Sure.\n\n" + call_block([weather])[:-len(spec.tool_end) - 6].strip(), cut="call"),
    ]


def _json_call(name, args):
    return "{" + f'"name": "{name}", "arguments": {json.dumps(args, ensure_ascii=False)}' + "}"


def _hermes_block(calls):
    return "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls)


def _xml_value(value):
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _xml_call(name, args):
    params = "".join(f"<parameter={k}>\n{_xml_value(v)}\n</parameter>\n" for k, v in args.items())
    return f"<function={name}>\n{params}</function>"


def _py_value(value):
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py_value(k)}: {_py_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_py_value(v) for v in value) + "]"
    return repr(value)


def _py_call(name, args):
    return f"{name}(" + ", ".join(f"{k}={_py_value(v)}" for k, v in args.items()) + ")"


def _lfm2_block(calls):
    return "<|tool_call_start|>[" + ", ".join(calls) + "]<|tool_call_end|>"


def _gemma_value(value):
    if isinstance(value, str):
        return f'<|"|>{value}<|"|>'
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_gemma_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_gemma_value(v) for v in value) + "]"
    return str(value)


def _gemma_call(name, args):
    return f"call:{name}{_gemma_value(args)}"


def _gemma_block(calls):
    return "".join(f"<|tool_call>{c}<tool_call|>" for c in calls)


HERMES = chat_format_make("hermes_json", reasoning=True)
QWEN_XML = chat_format_make("qwen_xml", reasoning=True)
LFM2 = chat_format_make("lfm2", reasoning=True)
GEMMA4 = chat_format_make("gemma4")
HARMONY = chat_format_make("harmony")
PLAIN = chat_format_make("plain", reasoning=True)
HERMES_NO_THINK = chat_format_make("hermes_json")


def _harmony() -> list[Golden]:
    s = HARMONY
    weather = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Paris","days":3}<|call|>'
    return [
        _g(s, "plain_text", "assistant", "<|channel|>final<|message|>Hello! How can I help?<|return|>", content="Hello! How can I help?"),
        _g(s, "reasoning_text", "assistant",
           "<|channel|>analysis<|message|>The user greets me.<|end|><|start|>assistant<|channel|>final<|message|>Hello there.<|return|>",
           reasoning="The user greets me.", content="Hello there."),
        _g(s, "reasoning_one_call", "assistant", f"<|channel|>analysis<|message|>Need the weather.<|end|>{weather}",
           reasoning="Need the weather.", calls=[("get_weather", {"city": "Paris", "days": 3})]),
        _g(s, "recipient_in_role", "assistant",
           ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris", "days": 3}<|call|>',
           calls=[("get_weather", {"city": "Paris", "days": 3})]),
        _g(s, "preamble_then_call", "assistant",
           "<|channel|>commentary<|message|>Checking the weather.<|end|>" + weather,
           content="Checking the weather.", calls=[("get_weather", {"city": "Paris", "days": 3})]),
        _g(s, "empty_arguments", "assistant", "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>",
           calls=[("get_time", {})]),
        _g(s, "nested_unicode", "assistant",
           "<|channel|>commentary to=functions.search <|constrain|>json<|message|>" + json.dumps(NESTED_ARGS) + "<|call|>",
           calls=[("search", NESTED_ARGS)]),
        _g(s, "arguments_out_of_order", "assistant", "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
           + json.dumps(OUT_OF_ORDER_ARGS) + "<|call|>", calls=[("get_weather", OUT_OF_ORDER_ARGS)]),
        _g(s, "call_inside_reasoning", "assistant",
           "<|channel|>analysis<|message|>Maybe call functions.get_time? No.<|end|><|start|>assistant<|channel|>final<|message|>It is 4.<|return|>",
           reasoning="Maybe call functions.get_time? No.", content="It is 4."),
        _g(s, "cut_in_reasoning", "assistant", "<|channel|>analysis<|message|>Let me think about the",
           reasoning="Let me think about the", cut="reasoning"),
        _g(s, "cut_in_call", "assistant", '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"Par',
           content='{"city":"Par', cut="call"),
    ]


def _plain() -> list[Golden]:
    s = PLAIN
    return [
        _g(s, "plain_text", "", "Hello! <b>How</b> can I help?", content="Hello! <b>How</b> can I help?"),
        _g(s, "reasoning_text", "<think>\n", "Short thought.</think>Hello.", reasoning="Short thought.", content="Hello."),
        _g(s, "tool_markup_is_text", "", '<tool_call>{"name": "get_time"}</tool_call>',
           content='<tool_call>{"name": "get_time"}</tool_call>'),
        _g(s, "cut_in_reasoning", "<think>\n", "Let me think", reasoning="Let me think", cut="reasoning"),
        _g(s, "stop_marker_ends_turn", "", "Done.<|im_end|>ignored", content="Done."),
    ]


# -- Llama 3, Mistral, DeepSeek V3 -------------------------------------------------------------------

LLAMA3 = chat_format_make("llama3_json")
LLAMA3_SEMICOLON = chat_format_make("llama3_json", variant="semicolon")
MISTRAL = chat_format_make("mistral", reasoning=True)
MISTRAL_ARRAY = chat_format_make("mistral", variant="json_array")
DEEPSEEK_R1 = chat_format_make("deepseek_v3", reasoning=True, reasoning_forced=True)
DEEPSEEK_V31 = chat_format_make("deepseek_v3", reasoning=True, variant="v3_1")
WEATHER = {"city": "Paris", "days": 3}


def _llama_call(name, args):
    return "{" + f'"name": "{name}", "parameters": {json.dumps(args, ensure_ascii=False)}' + "}"


def _llama() -> list[Golden]:
    s, weather = LLAMA3, _llama_call("get_weather", WEATHER)
    cut = weather[:-8]
    return [
        _g(s, "plain_text", "", "Hello! How can I help you today?<|eot_id|>", content="Hello! How can I help you today?"),
        _g(s, "bare_call", "", weather + "<|eot_id|>", calls=[("get_weather", WEATHER)]),
        _g(s, "python_tag_call", "", "<|python_tag|>" + weather + "<|eom_id|>", calls=[("get_weather", WEATHER)]),
        _g(s, "text_then_python_tag_call", "", "Let me check the weather.\n\n<|python_tag|>" + weather,
           content="Let me check the weather.", calls=[("get_weather", WEATHER)]),
        _g(s, "empty_arguments", "", _llama_call("get_time", {}), calls=[("get_time", {})]),
        _g(s, "nested_unicode", "", _llama_call("search", NESTED_ARGS), calls=[("search", NESTED_ARGS)]),
        _g(s, "json_content_is_not_a_call", "", '{"answer": "4", "confidence": 1}', content='{"answer": "4", "confidence": 1}'),
        _g(s, "call_shaped_text_later_is_content", "", 'Write {"name": "get_time", "parameters": {}} to call it.',
           content='Write {"name": "get_time", "parameters": {}} to call it.'),
        _g(s, "typed_call", "", '{"type": "function", "name": "get_time", "parameters": {}}', calls=[("get_time", {})]),
        _g(s, "builtin_code_call_is_text", "", '<|python_tag|>brave_search.call(query="weather in Paris")<|eom_id|>',
           content='<|python_tag|>brave_search.call(query="weather in Paris")'),
        _g(s, "cut_in_call", "", cut, content=cut, cut="call"),
        _g(LLAMA3_SEMICOLON, "several_calls", "", weather + "; " + _llama_call("get_time", {}) + "<|eom_id|>",
           calls=[("get_weather", WEATHER), ("get_time", {})]),
        _g(LLAMA3_SEMICOLON, "python_tag_several_calls", "", "<|python_tag|>" + weather + "; " + _llama_call("get_time", {}),
           calls=[("get_weather", WEATHER), ("get_time", {})]),
        _g(LLAMA3_SEMICOLON, "semicolon_then_text", "", weather + "; no more calls",
           content="; no more calls", calls=[("get_weather", WEATHER)]),
    ]


def _mistral_args_call(name, args):
    return f"{name}[ARGS]{json.dumps(args, ensure_ascii=False)}"


def _mistral_args_block(calls):
    return "".join(f"[TOOL_CALLS]{c}" for c in calls)


def _mistral_array_block(calls):
    return "[TOOL_CALLS][" + ", ".join(calls) + "]"


def _deepseek_r1_call(name, args):
    return f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{json.dumps(args, ensure_ascii=False)}\n```<｜tool▁call▁end｜>"


def _deepseek_v31_call(name, args):
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{json.dumps(args, ensure_ascii=False)}<｜tool▁call▁end｜>"


def _deepseek_block(separator):
    return lambda calls: "<｜tool▁calls▁begin｜>" + separator.join(calls) + "<｜tool▁calls▁end｜>"


def _mistral_extras() -> list[Golden]:
    weather = _mistral_args_call("get_weather", WEATHER)
    return [
        _g(MISTRAL, "call_id_then_text", "", "[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{} Done.</s>",
           content="Done.", calls=[("get_time", {})]),
        _g(MISTRAL, "think_then_calls", "", f"[THINK]Two calls.[/THINK]{_mistral_args_block([weather, 'get_time[ARGS]{}'])}</s>",
           reasoning="Two calls.", calls=[("get_weather", WEATHER), ("get_time", {})]),
        _g(MISTRAL_ARRAY, "ids_are_dropped", "",
           '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}, "id": "a1b2c3d4e"}]</s>',
           calls=[("get_weather", WEATHER)]),
    ]


def _deepseek_extras() -> list[Golden]:
    r1 = _deepseek_block("\n")([_deepseek_r1_call("get_time", {})])
    return [
        _g(DEEPSEEK_R1, "text_around_calls", "<think>\n", f"Time.\n</think>\n\nChecking.{r1}Done.<｜end▁of▁sentence｜>",
           reasoning="Time.", content="Checking.\n\nDone.", calls=[("get_time", {})]),
        _g(DEEPSEEK_V31, "no_thinking", "", _deepseek_block("")([_deepseek_v31_call("get_time", {})]) + "<｜end▁of▁sentence｜>",
           calls=[("get_time", {})]),
    ]


GOLDEN: list[Golden] = [
    *_tag_family(HERMES, _json_call, _hermes_block, "<think>\n"),
    *_tag_family(QWEN_XML, _xml_call, _hermes_block, "<think>\n"),
    *_tag_family(LFM2, _py_call, _lfm2_block, "<think>\n"),
    *_tag_family(GEMMA4, _gemma_call, _gemma_block, "<|channel>thought\n"),
    _g(GEMMA4, "call_then_tool_response_stop", "",
       "<|tool_call>call:get_time{}<tool_call|><|tool_response>", calls=[("get_time", {})]),
    _g(HERMES, "string_encoded_arguments", "",
       '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}\n</tool_call>',
       calls=[("get_weather", {"city": "Paris"})]),
    _g(HERMES_NO_THINK, "qwen25_no_reasoning_markers", "", "Sure.<tool_call>\n" + _json_call("get_time", {}) + "\n</tool_call><|im_end|>",
       content="Sure.", calls=[("get_time", {})]),
    *_harmony(),
    *_plain(),
    *_llama(),
    *_tag_family(MISTRAL, _mistral_args_call, _mistral_args_block, "[THINK]"),
    *(g for g in _tag_family(MISTRAL_ARRAY, _json_call, _mistral_array_block, "") if "reasoning" not in g.name),
    *_mistral_extras(),
    *_tag_family(DEEPSEEK_R1, _deepseek_r1_call, _deepseek_block("\n"), "<think>\n"),
    *_tag_family(DEEPSEEK_V31, _deepseek_v31_call, _deepseek_block(""), "<think>"),
    *_deepseek_extras(),
]
