"""The request fields peers' clients send that would change decoding, each with what jaxchat does with it.

Contract: `FIELDS` is the table docs/api.md prints (a test keeps the two equal): one `Field` per top-level body
field of Chat Completions / Completions that OpenAI, vLLM, SGLang or llama.cpp's server read to change what is
generated, with its `status`:

- "honoured": read and applied (`jaxchat.api.request`, `jaxchat.chat.request`, `jaxchat.chat.structured`);
- "alias": another spelling of an honoured field (`alias_of`), applied the same way; both set is a 400;
- "neutral only": accepted only at the values under which it changes nothing (`neutral`); any other value
  is a 400 naming it, never silently ignored;
- "refused": any non-null value is a 400 naming it;
- "no effect": accepted; it does not change the generated text (metadata, caching, routing hints).

`check_fields(body)` raises `RequestError(name, ...)` for the first refused or non-neutral field of `body`
(null reads as absent). Fields not in the table are ignored, as the OpenAI API ignores unknown fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from jaxchat.chat.errors import RequestError, got

__all__ = ["FIELDS", "Field", "check_fields"]


@dataclass(frozen=True)
class Field:
    name: str
    origin: str  # who sends it: "OpenAI", "vLLM", "SGLang", "llama.cpp" (comma-separated)
    status: str  # "honoured" | "alias" | "neutral only" | "refused" | "no effect"
    note: str = ""
    neutral: tuple = ()  # "neutral only": the accepted values
    alias_of: str = ""


def _f(name, origin, status, note="", neutral=(), alias_of=""):
    return Field(name, origin, status, note, tuple(neutral), alias_of)


FIELDS: tuple[Field, ...] = (
    # honoured
    _f("max_tokens", "OpenAI", "honoured"),
    _f("max_completion_tokens", "OpenAI", "honoured", "wins over max_tokens"),
    _f("temperature", "OpenAI", "honoured"),
    _f("top_p", "OpenAI", "honoured"),
    _f("n", "OpenAI", "honoured", "each choice seeded with seed + index"),
    _f("seed", "OpenAI", "honoured", "same seed, same sampled output"),
    _f("stop", "OpenAI", "honoured"),
    _f("presence_penalty", "OpenAI", "honoured"),
    _f("frequency_penalty", "OpenAI", "honoured"),
    _f("logit_bias", "OpenAI", "honoured", "on device beside the mask; -100 bans; at most 32 entries"),
    _f("logprobs", "OpenAI", "honoured"),
    _f("top_logprobs", "OpenAI", "honoured"),
    _f("response_format", "OpenAI", "honoured", "json_object, json_schema"),
    _f("tools", "OpenAI", "honoured", "function and custom (text, lark, regex) tools"),
    _f("tool_choice", "OpenAI", "honoured"),
    _f("parallel_tool_calls", "OpenAI", "honoured"),
    _f("reasoning_effort", "OpenAI", "honoured"),
    _f("top_k", "vLLM, SGLang, llama.cpp", "honoured"),
    _f("min_p", "vLLM, SGLang, llama.cpp", "honoured"),
    _f("repetition_penalty", "vLLM, SGLang", "honoured"),
    _f("stop_token_ids", "vLLM, SGLang", "honoured"),
    _f("ignore_eos", "vLLM, SGLang, llama.cpp", "honoured"),
    _f("chat_template_kwargs", "vLLM, SGLang", "honoured"),
    _f("structured_outputs", "vLLM", "honoured", "regex, choice, grammar, json, json_object"),
    _f("guided_regex", "vLLM", "honoured"),
    _f("guided_choice", "vLLM", "honoured"),
    _f("guided_grammar", "vLLM", "honoured"),
    _f("guided_json", "vLLM", "honoured"),
    _f("regex", "SGLang", "honoured"),
    _f("ebnf", "SGLang", "honoured"),
    _f("json_schema", "SGLang, llama.cpp", "honoured", "a JSON string (SGLang) or an object (llama.cpp)"),
    _f("grammar", "llama.cpp", "honoured", "GBNF, read as xgrammar EBNF"),
    # aliases
    _f("repeat_penalty", "llama.cpp", "alias", alias_of="repetition_penalty"),
    _f("n_predict", "llama.cpp", "alias", "-1: up to the context", alias_of="max_tokens"),
    # accepted at their neutral values only
    _f("best_of", "OpenAI, vLLM", "neutral only", "equal to n (or 1)", neutral=(1,)),
    _f("use_beam_search", "vLLM", "neutral only", neutral=(False,)),
    _f("length_penalty", "vLLM", "neutral only", neutral=(1, 1.0)),
    _f("min_tokens", "vLLM", "neutral only", neutral=(0,)),
    _f("min_new_tokens", "SGLang", "neutral only", neutral=(0,)),
    _f("include_stop_str_in_output", "vLLM", "neutral only", neutral=(False,)),
    _f("skip_special_tokens", "vLLM, SGLang", "neutral only", "jaxchat keeps special tokens' text", neutral=(False,)),
    _f("spaces_between_special_tokens", "vLLM", "neutral only", neutral=(True,)),
    _f("allowed_token_ids", "vLLM", "neutral only", neutral=([],)),
    _f("bad_words", "vLLM", "neutral only", neutral=([],)),
    _f("no_stop_trim", "SGLang", "neutral only", neutral=(False,)),
    _f("separate_reasoning", "SGLang", "neutral only", "reasoning is always separated", neutral=(True,)),
    _f("echo", "vLLM (chat)", "neutral only", "chat only; completions honour it", neutral=(False,)),
    _f("add_generation_prompt", "vLLM", "neutral only", neutral=(True,)),
    _f("continue_final_message", "vLLM, SGLang", "neutral only", neutral=(False,)),
    _f("typical_p", "llama.cpp", "neutral only", neutral=(1, 1.0)),
    _f("tfs_z", "llama.cpp", "neutral only", neutral=(1, 1.0)),
    _f("mirostat", "llama.cpp", "neutral only", neutral=(0,)),
    _f("dynatemp_range", "llama.cpp", "neutral only", neutral=(0, 0.0)),
    _f("xtc_probability", "llama.cpp", "neutral only", neutral=(0, 0.0)),
    _f("dry_multiplier", "llama.cpp", "neutral only", neutral=(0, 0.0)),
    _f("top_n_sigma", "llama.cpp", "neutral only", neutral=(-1, -1.0)),
    _f("repeat_last_n", "llama.cpp", "neutral only", "-1: the penalty covers the whole context", neutral=(-1,)),
    _f("penalize_nl", "llama.cpp", "neutral only", neutral=(True,)),
    _f("n_probs", "llama.cpp", "neutral only", "use logprobs / top_logprobs", neutral=(0,)),
    _f("return_tokens_as_token_ids", "vLLM", "neutral only", neutral=(False,)),
    _f("return_hidden_states", "SGLang", "neutral only", neutral=(False,)),
    _f("modalities", "OpenAI", "neutral only", neutral=(["text"],)),
    # refused whatever the value
    _f("functions", "OpenAI", "refused", "deprecated: use tools"),
    _f("function_call", "OpenAI", "refused", "deprecated: use tool_choice"),
    _f("audio", "OpenAI", "refused"),
    _f("web_search_options", "OpenAI", "refused"),
    _f("prompt_logprobs", "vLLM", "refused"),
    _f("truncate_prompt_tokens", "vLLM", "refused"),
    _f("logits_processors", "vLLM", "refused"),
    _f("custom_logit_processor", "SGLang", "refused"),
    _f("lora_path", "SGLang", "refused"),
    _f("samplers", "llama.cpp", "refused"),
    _f("dry_base", "llama.cpp", "refused", "set dry_multiplier to 0 instead"),
    _f("mirostat_tau", "llama.cpp", "refused"),
    _f("mirostat_eta", "llama.cpp", "refused"),
    _f("stop_regex", "SGLang", "refused"),
    # accepted, no effect on the text
    _f("user", "OpenAI", "no effect"),
    _f("metadata", "OpenAI", "no effect"),
    _f("store", "OpenAI", "no effect"),
    _f("service_tier", "OpenAI", "no effect"),
    _f("prediction", "OpenAI", "no effect", "a speed hint: the output is the same"),
    _f("prompt_cache_key", "OpenAI", "no effect", "prefix caching is automatic"),
    _f("safety_identifier", "OpenAI", "no effect"),
    _f("cache_prompt", "llama.cpp", "no effect", "prefix caching is automatic"),
    _f("guided_decoding_backend", "vLLM", "no effect", "one backend: xgrammar"),
    _f("priority", "vLLM", "no effect"),
    _f("request_id", "vLLM", "no effect"),
)

_BY_NAME = {f.name: f for f in FIELDS}


def _same(a: object, b: object) -> bool:
    """JSON equality that keeps true apart from 1."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def check_fields(body: dict, *, chat: bool) -> None:
    """A 400 naming the first refused field of `body`, or one set away from its neutral values."""
    for name, value in body.items():
        field = _BY_NAME.get(name)
        if field is None or value is None:
            continue
        if field.status == "refused":
            why = f": {field.note}" if field.note else ""
            raise RequestError(name, f"{name} is not supported{why}")
        if field.status != "neutral only" or (name == "echo" and not chat):
            continue
        if name == "best_of" and _same(value, body.get("n", 1)):
            continue
        if not any(_same(value, v) for v in field.neutral):
            allowed = " or ".join(json.dumps(v) for v in field.neutral)
            note = f" ({field.note})" if field.note else ""
            raise RequestError(name, f"{name} is not supported except as {allowed}{note}, got {got(value)}")
