"""ChatTemplate: parity with transformers' own rendering on real templates, message normalisation, sandboxing."""

from __future__ import annotations

import copy
import json
from datetime import datetime

import pytest

from jaxchat.assets import template_path
from jaxchat.chat.template import ChatTemplate, TemplateError

BOS, EOS = "<s>", "</s>"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name"},
                    "days": {"type": "integer", "description": "Forecast length"},
                },
                "required": ["city"],
            },
        },
    }
]
ARGS = {"city": "Zürich", "days": 2}


def _src(name: str) -> str:
    return template_path(name).read_text(encoding="utf-8")


def _conversation(openai_form: bool, reasoning: bool = False) -> list[dict]:
    """The same conversation in OpenAI wire form (ours) or transformers' usual form (the reference)."""
    call = {
        "id": "call_abc123",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(ARGS) if openai_form else ARGS},
    }
    # the OpenAI SDK sends content null with tool calls; ChatTemplate reads a null content as ""
    assistant = {"role": "assistant", "content": None if openai_form else "", "tool_calls": [call]}
    if reasoning:
        assistant["reasoning_content"] = "The user wants the weather, so I call the tool."
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What's the weather in Zürich for two days?"},
        assistant,
        {"role": "tool", "tool_call_id": "call_abc123", "name": "get_weather", "content": '{"temp_c": 21}'},
    ]


def _reference(src: str, messages: list[dict], tools=None, **kwargs) -> str:
    transformers_utils = pytest.importorskip("transformers.utils.chat_template_utils")
    rendered, _ = transformers_utils.render_jinja_template(
        conversations=[messages],
        tools=tools,
        chat_template=src,
        add_generation_prompt=True,
        bos_token=BOS,
        eos_token=EOS,
        **kwargs,
    )
    return rendered[0]


PARITY_TEMPLATES = [
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Qwen-Qwen3-0.6B.jinja",
    "Qwen-QwQ-32B.jinja",
    "Qwen3-Coder.jinja",
    "Qwen3.5-4B.jinja",
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
    "openai-gpt-oss-120b.jinja",
    "google-gemma-4-31B-it.jinja",
    "LFM2.5-8B-A1B.jinja",
    "LFM2.5-Instruct.jinja",
]


@pytest.mark.parametrize("name", PARITY_TEMPLATES, ids=[n.removesuffix(".jinja") for n in PARITY_TEMPLATES])
@pytest.mark.parametrize("reasoning", [False, True], ids=["plain", "reasoning"])
def test_parity_with_transformers(name, reasoning):
    src = _src(name)
    kwargs = {"enable_thinking": True} if reasoning else {}
    ours = ChatTemplate(src, bos_token=BOS, eos_token=EOS).render(
        _conversation(openai_form=True, reasoning=reasoning), tools=TOOLS, **kwargs
    )
    assert ours == _reference(src, _conversation(openai_form=False, reasoning=reasoning), TOOLS, **kwargs)
    assert "get_weather" in ours


def test_parity_without_tools_and_thinking_off():
    src = _src("Qwen-Qwen3-0.6B.jinja")
    messages = [{"role": "user", "content": "Hi"}]
    ours = ChatTemplate(src).render(messages, enable_thinking=False)
    assert ours == _reference(src, messages, enable_thinking=False)
    assert ours.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert ChatTemplate(src).render(messages, tools=[]) == ChatTemplate(src).render(messages)


# --- messages --------------------------------------------------------------------------------

ECHO = (
    "{% for m in messages %}[{{ m.role }}|{{ m.content }}"
    "{% for c in m.tool_calls or [] %}|{{ c.function.name }}:{{ c.function.arguments | tojson }}"
    ":{{ c.name }}:{{ c.arguments is mapping }}:{{ c.id }}{% endfor %}"
    "{% if m.reasoning_content is defined %}|r={{ m.reasoning_content }}|t={{ m.thinking }}{% endif %}]"
    "{% endfor %}{% if add_generation_prompt %}<gen>{% endif %}"
)


def test_tool_calls_in_openai_form_reach_templates_as_mappings():
    messages = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": [1, "x"]}'}}],
        }
    ]
    before = copy.deepcopy(messages)
    out = ChatTemplate(ECHO).render(messages, add_generation_prompt=False)
    assert out == '[assistant||f:{"a": [1, "x"]}:f:True:c1]'
    assert messages == before  # the caller's messages are not modified


def test_undecodable_arguments_stay_text():
    messages = [
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}
    ]
    out = ChatTemplate(ECHO).render(messages, add_generation_prompt=False)
    assert out == '[assistant||f:"{oops":f:False:]'


def test_content_parts_are_joined():
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    template = ChatTemplate(ECHO)
    assert template.render([{"role": "user", "content": parts}]) == "[user|first\nsecond]<gen>"
    with pytest.raises(TemplateError, match=r"messages\[0\]\.content\[1\]"):
        template.render([{"role": "user", "content": [parts[0], {"type": "image_url", "image_url": {"url": "x"}}]}])


def test_reasoning_content_is_passed_through():
    out = ChatTemplate(ECHO).render([{"role": "assistant", "content": "ok", "reasoning_content": "hmm"}])
    assert out == "[assistant|ok|r=hmm|t=hmm]<gen>"
    out = ChatTemplate(ECHO).render([{"role": "assistant", "content": "ok", "reasoning": "hmm"}])
    assert out == "[assistant|ok|r=hmm|t=hmm]<gen>"


def test_template_variables():
    template = ChatTemplate(
        "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}|{{ enable_thinking }}|{{ custom }}",
        bos_token="<B>",
        eos_token="<E>",
        special_tokens={"pad_token": "<P>"},
    )
    assert template.render([], enable_thinking=False, custom=[1, 2]) == "<B>|<E>|<P>|False|[1, 2]"
    with pytest.raises(TemplateError, match=r"messages\[0\]\.role"):
        template.render([{"content": "no role"}])


# --- environment -----------------------------------------------------------------------------


def test_tojson_like_transformers():
    template = ChatTemplate(
        "{{ x | tojson }}#{{ x | tojson(indent=2) }}#{{ x | tojson(separators=(',', ':')) }}"
        "#{{ x | tojson(sort_keys=true) }}#{{ x | tojson(ensure_ascii=true) }}"
    )
    x = {"b": "<é&>", "a": 1}
    expected = "#".join(
        [
            json.dumps(x, ensure_ascii=False),
            json.dumps(x, ensure_ascii=False, indent=2),
            json.dumps(x, ensure_ascii=False, separators=(",", ":")),
            json.dumps(x, ensure_ascii=False, sort_keys=True),
            json.dumps(x),
        ]
    )
    assert template.render([], x=x) == expected


def test_globals_blocks_and_whitespace():
    src = (
        "{% set ns = namespace(n=0) %}\n"
        "{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{% set ns.n = ns.n + i %}{% endfor %}\n"
        "{{ ns.n }}|{% generation %}gen{% endgeneration %}|{{ dict(a=1) | tojson }}|{{ strftime_now('%Y') }}"
    )
    assert ChatTemplate(src).render([]) == f'3|gen|{{"a": 1}}|{datetime.now().year}'


def test_jinja_in_user_data_is_text():
    payload = "{{ 7 * 7 }} {% for x in range(3) %}x{% endfor %} {{ ''.__class__ }} {{ raise_exception('x') }}"
    tools = [{"type": "function", "function": {"name": "t", "description": payload, "parameters": {}}}]
    out = ChatTemplate(_src("Qwen-Qwen2.5-7B-Instruct.jinja")).render(
        [{"role": "user", "content": payload}], tools=tools
    )
    assert out.count(payload) == 2 and "49" not in out


@pytest.mark.parametrize(
    "src",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__ }}",
        "{{ raise_exception.__globals__ }}",
        "{{ namespace.__init__.__globals__ }}",
        "{% set ns = namespace(_x=1) %}",
        "{{ messages.append(1) }}",
        "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
    ],
)
def test_hostile_template_fails_cleanly(src):
    with pytest.raises(TemplateError):
        ChatTemplate(src).render([{"role": "user", "content": "hi"}])


def test_raise_exception_and_broken_templates():
    with pytest.raises(TemplateError) as info:
        ChatTemplate("{{ raise_exception('System role not supported') }}").render([])
    assert str(info.value) == "System role not supported"
    assert isinstance(info.value, ValueError)
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplate("{% if %}")
    with pytest.raises(TemplateError, match="TypeError"):
        ChatTemplate("{{ 'a' + messages }}").render([])
    with pytest.raises(TemplateError, match="System role not supported"):
        ChatTemplate(_src("google-gemma-2-2b-it.jinja")).render([{"role": "system", "content": "x"}])


def test_tools_enabled():
    assert ChatTemplate(_src("Qwen-Qwen2.5-7B-Instruct.jinja")).tools_enabled
    assert ChatTemplate(_src("meta-llama-Llama-3.1-8B-Instruct.jinja")).tools_enabled
    assert ChatTemplate(_src("LFM2-8B-A1B.jinja")).tools_enabled
    assert not ChatTemplate(_src("google-gemma-2-2b-it.jinja")).tools_enabled
    assert not ChatTemplate(_src("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja")).tools_enabled
    assert not ChatTemplate(_src("deepseek-ai-DeepSeek-V3.1.jinja")).tools_enabled  # definitions go in the system prompt
    # llama.cpp's R1 template dumps `tools | map(attribute='function')`, a lazy Jinja sequence
    assert ChatTemplate(_src("llama-cpp-deepseek-r1.jinja")).tools_enabled
    assert ChatTemplate("{{ [{'a': 1}, {'a': 2}] | map(attribute='a') | tojson }}").render([]) == "[1, 2]"
