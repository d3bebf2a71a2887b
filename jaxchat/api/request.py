"""Read an OpenAI request body once, into a typed value: every 400 about the body is raised here.

Contract
--------
`parse_chat_request(body, limits, max_context=None) -> ChatRequest` and
`parse_completion_request(body, limits, max_context=None) -> CompletionRequest` are pure: they never
modify `body`, and they raise `jaxchat.chat.RequestError(param, message)` whose `param` names the
offending field the way the OpenAI API spells it (`messages[2].role`, `stream_options.include_usage`,
`stop[1]`, `tools[0].function.parameters`). A field set to null reads as absent; unknown fields are
ignored, except the decoding fields of `jaxchat.api.fields.FIELDS`: each is honoured or a 400 naming it
(`check_fields`; llama.cpp's `repeat_penalty` and `n_predict` read as `repetition_penalty` and `max_tokens`). Every bound comes from `limits` (`jaxchat.api.Limits`); `max_context` (the model's) bounds
`max_tokens`. The chat body's constraint fields (tools, tool_choice, response_format, thinking) are
read by `jaxchat.chat.chat_constraint_request_from_openai`, called exactly once per request, and
every JSON schema in them must be a valid JSON schema.

What is checked besides: `model` (a string), `stream` and `stream_options.include_usage` (booleans;
`stream_options` needs `stream: true`), `n` 1..`limits.max_n`, `max_tokens` / `max_completion_tokens`
positive and within the context (`max_completion_tokens` wins), `temperature` 0..2, `top_p` (0, 1],
`top_k` >= -1, `min_p` 0..1, `presence_penalty` and `frequency_penalty` -2..2, `repetition_penalty`
> 0, `seed` a 64-bit integer, `stop` a string or at most `limits.max_stop` non-empty strings,
`ignore_eos` a boolean, `stop_token_ids` non-negative integers, `logit_bias` at most `LOGIT_BIAS_SLOTS`
token-id strings mapped to -100..100 (whether an id is in the vocabulary is the pipeline's check); for chat `logprobs` a boolean and
`top_logprobs` 0..`limits.max_top_logprobs` with `logprobs: true`; for completions `prompt` a
string or a list of token ids (or a one-item list of either), `echo` a boolean, `logprobs`
0..`limits.max_completion_logprobs`.

The checks that need the model (the rendered prompt's length, a template without tools) are the
service's (`jaxchat.api.service`).
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxchat.api.chat_messages import parse_messages
from jaxchat.api.fields import check_fields
from jaxchat.api.limits import Limits
from jaxchat.chat import ConstraintRequest, chat_constraint_request_from_openai
from jaxchat.chat.errors import RequestError, expect_bool, expect_int, expect_number, expect_object, got, is_int
from jaxchat.chat.structured import OutputConstraint, read_output_constraint
from jaxchat.engine.types import LOGIT_BIAS_SLOTS

__all__ = ["ChatRequest", "CompletionRequest", "Sampling", "parse_chat_request", "parse_completion_request"]

_SEED_RANGE = (-(2**63), 2**64 - 1)
COMPLETION_MAX_TOKENS = 16  # the OpenAI default for /v1/completions


@dataclass(frozen=True)
class Sampling:
    """The sampling fields of a request, defaulted as the OpenAI API defaults them."""

    max_tokens: int | None = None  # None: up to the end of the model's context
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off (-1 in a request means the same)
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None = off; k = the chosen token's logprob plus the top k
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, value); -100 reads as -inf (a ban)


@dataclass(frozen=True)
class ChatRequest:
    messages: tuple[dict, ...]
    constraint: ConstraintRequest
    sampling: Sampling
    model: str | None = None
    n: int = 1
    stream: bool = False
    include_usage: bool = False


@dataclass(frozen=True)
class CompletionRequest:
    prompt: str | tuple[int, ...]
    sampling: Sampling
    model: str | None = None
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    logprobs: int | None = None
    output: OutputConstraint | None = None  # a structured-output field or a JSON response_format


def _body(raw: object) -> dict:
    if not isinstance(raw, dict):
        raise RequestError(None, f"the request body must be a JSON object, got {got(raw)}")
    return {k: v for k, v in raw.items() if v is not None}


def _stream(body: dict) -> tuple[bool, bool]:
    """(stream, include_usage)."""
    stream = expect_bool(body.get("stream"), "stream", False)
    options = body.get("stream_options")
    if options is None:
        return stream, False
    expect_object(options, "stream_options", "an object like {'include_usage': true}")
    if not stream:
        raise RequestError("stream_options", "stream_options is only allowed when stream is true")
    expect_bool(options.get("continuous_usage_stats"), "stream_options.continuous_usage_stats", False)
    return stream, expect_bool(options.get("include_usage"), "stream_options.include_usage", False)


def _stop(raw: object, limits: Limits) -> tuple[str, ...]:
    if raw is None:
        return ()
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list):
        raise RequestError("stop", f"expected a string or an array of strings, got {got(raw)}")
    if len(items) > limits.max_stop:
        raise RequestError("stop", f"at most {limits.max_stop} stop sequences are allowed, got {len(items)}")
    for i, item in enumerate(items):
        param = "stop" if isinstance(raw, str) else f"stop[{i}]"
        if not isinstance(item, str):
            raise RequestError(param, f"expected a string, got {got(item)}")
        if not item:
            raise RequestError(param, "stop sequences must not be empty")
    return tuple(items)


def _token_ids(raw: object, param: str) -> tuple[int, ...]:
    if not isinstance(raw, list):
        raise RequestError(param, f"expected an array of token ids, got {got(raw)}")
    for i, tok in enumerate(raw):
        if not is_int(tok) or tok < 0:
            raise RequestError(f"{param}[{i}]", f"expected a non-negative integer, got {got(tok)}")
    return tuple(raw)


def _sampling(body: dict, limits: Limits, max_context: int | None, logprobs: int | None,
              default_max_tokens: int | None) -> Sampling:
    cap = max_context or limits.max_tokens_cap
    context = f" (the model's context is {max_context} tokens)" if max_context else ""
    predict = expect_int(_aliased(body, "max_tokens", "n_predict"), "n_predict", -1, cap, what=context)
    if predict == 0:
        raise RequestError("n_predict", "n_predict must be -1 (up to the context) or positive, got 0")
    rep = "repeat_penalty" if _aliased(body, "repetition_penalty", "repeat_penalty") is not None else \
        "repetition_penalty"
    max_tokens = expect_int(body.get("max_tokens"), "max_tokens", 1, cap, what=context)
    if max_tokens is None and predict is not None and predict > 0:
        max_tokens = predict
    max_tokens = expect_int(body.get("max_completion_tokens"), "max_completion_tokens", 1, cap, max_tokens, context)
    return Sampling(
        max_tokens=max_tokens if max_tokens is not None else default_max_tokens,
        temperature=expect_number(body.get("temperature"), "temperature", 0.0, 2.0, 1.0),
        top_p=expect_number(body.get("top_p"), "top_p", 0.0, 1.0, 1.0, lo_open=True),
        top_k=max(0, expect_int(body.get("top_k"), "top_k", -1, None, 0)),
        min_p=expect_number(body.get("min_p"), "min_p", 0.0, 1.0, 0.0),
        presence_penalty=expect_number(body.get("presence_penalty"), "presence_penalty", -2.0, 2.0, 0.0),
        frequency_penalty=expect_number(body.get("frequency_penalty"), "frequency_penalty", -2.0, 2.0, 0.0),
        repetition_penalty=expect_number(body.get(rep), rep, 0.0, None, 1.0, lo_open=True),
        seed=expect_int(body.get("seed"), "seed", *_SEED_RANGE),
        stop=_stop(body.get("stop"), limits),
        stop_token_ids=_token_ids(body["stop_token_ids"], "stop_token_ids") if "stop_token_ids" in body else (),
        ignore_eos=expect_bool(body.get("ignore_eos"), "ignore_eos", False),
        logprobs=logprobs,
        logit_bias=_logit_bias(body.get("logit_bias")),
    )


def _logit_bias(raw: object) -> tuple[tuple[int, float], ...]:
    """`logit_bias` {token id string: -100..100} as (id, value) pairs in id order; -100 becomes -inf, so that it
    bans the token whatever its logit (OpenAI: "-100 should result in a ban"); zeros are dropped."""
    if raw is None:
        return ()
    expect_object(raw, "logit_bias", "an object mapping token ids (as strings) to numbers from -100 to 100")
    out = {}
    for key, value in raw.items():
        param = f"logit_bias.{key}"
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise RequestError(param, f"expected a token id (a non-negative integer as a string), got {key!r}")
        value = expect_number(value, param, -100.0, 100.0)
        if value:
            out[int(key)] = float("-inf") if value == -100 else float(value)
    if len(out) > LOGIT_BIAS_SLOTS:
        raise RequestError("logit_bias", f"at most {LOGIT_BIAS_SLOTS} non-zero entries are supported, got {len(out)}")
    return tuple(sorted(out.items()))


def _aliased(body: dict, name: str, alias: str) -> object:
    """`body[alias]` (llama.cpp's spelling of `name`), None when absent; both set is a 400 naming both."""
    if alias in body and name in body:
        raise RequestError(alias, f"{name} and {alias} are the same setting; send one of them")
    return body.get(alias)


def _model(body: dict) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("model", f"expected the model name as a string, got {got(model)}")
    return model


def _check_schemas(request: ConstraintRequest) -> None:
    """Every JSON schema of the request is a valid JSON schema (a 400 naming it otherwise)."""
    schemas = [(f"tools[{i}].function.parameters", t["function"]["parameters"]) for i, t in enumerate(request.tools)]
    if request.response_format == "json_schema" and request.json_schema is not None:
        schemas.append(("response_format.json_schema.schema", request.json_schema))
    _check_output_schema(request.output)
    _check_json_schemas(schemas)


def _check_output_schema(output: OutputConstraint | None) -> None:
    if output is not None and output.schema is not None:
        _check_json_schemas([(output.param, output.schema)])


def _check_json_schemas(schemas: list[tuple[str, dict]]) -> None:
    import jsonschema  # not needed to import the package

    for param, schema in schemas:
        try:
            jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise RequestError(param, f"invalid JSON schema: {exc.message}") from None


def parse_chat_request(raw: object, limits: Limits | None = None, max_context: int | None = None) -> ChatRequest:
    limits = limits or Limits()
    body = _body(raw)
    check_fields(body, chat=True)
    model = _model(body)
    messages = parse_messages(body.get("messages"), limits)
    stream, include_usage = _stream(body)
    n = expect_int(body.get("n"), "n", 1, limits.max_n, 1)
    logprobs = expect_bool(body.get("logprobs"), "logprobs", False)
    top = expect_int(body.get("top_logprobs"), "top_logprobs", 0, limits.max_top_logprobs)
    if top is not None and not logprobs:
        raise RequestError("top_logprobs", "top_logprobs needs logprobs set to true")
    sampling = _sampling(body, limits, max_context, (top or 0) if logprobs else None, None)
    constraint = chat_constraint_request_from_openai(
        body, max_tools=limits.max_tools, max_schema_depth=limits.max_schema_depth
    )
    _check_schemas(constraint)
    return ChatRequest(messages, constraint, sampling, model, n, stream, include_usage)


def _prompt(raw: object, limits: Limits) -> str | tuple[int, ...]:
    if raw is None:
        raise RequestError("prompt", "missing required field: prompt (a string or an array of token ids)")
    param = "prompt"
    if isinstance(raw, list) and raw and all(isinstance(p, (str, list)) for p in raw):
        if len(raw) > limits.max_prompt_items:
            raise RequestError("prompt", f"at most {limits.max_prompt_items} prompt(s) per request, got {len(raw)}")
        raw, param = raw[0], "prompt[0]"
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, list):
        raise RequestError(param, f"expected a string or an array of token ids, got {got(raw)}")
    if not raw:
        raise RequestError(param, "prompt must not be empty")
    for i, tok in enumerate(raw):
        if not is_int(tok) or tok < 0:
            raise RequestError(f"{param}[{i}]", f"expected a non-negative token id, got {got(tok)}")
    return tuple(raw)


def parse_completion_request(raw: object, limits: Limits | None = None,
                             max_context: int | None = None) -> CompletionRequest:
    limits = limits or Limits()
    body = _body(raw)
    check_fields(body, chat=False)
    model = _model(body)
    prompt = _prompt(body.get("prompt"), limits)
    if body.get("suffix"):
        raise RequestError("suffix", "suffix is not supported")
    stream, include_usage = _stream(body)
    n = expect_int(body.get("n"), "n", 1, limits.max_n, 1)
    sampling = _sampling(body, limits, max_context, None, COMPLETION_MAX_TOKENS)
    echo = expect_bool(body.get("echo"), "echo", False)
    logprobs = expect_int(body.get("logprobs"), "logprobs", 0, limits.max_completion_logprobs)
    output = _completion_output(body, limits)
    return CompletionRequest(prompt, sampling, model, n, stream, include_usage, echo, logprobs, output)


def _completion_output(body: dict, limits: Limits) -> OutputConstraint | None:
    """A completion's output constraint: a structured-output field, or a JSON `response_format` (as vLLM reads
    it on completions); both set is a 400 naming both."""
    output = read_output_constraint(body, limits.max_schema_depth)
    fmt = chat_constraint_request_from_openai({"response_format": body.get("response_format")},
                                              max_schema_depth=limits.max_schema_depth)
    if fmt.response_format != "text":
        if output is not None:
            raise RequestError(output.param, f"response_format and {output.param} both constrain the output; "
                               "send at most one of them")
        output = OutputConstraint("json", "response_format", schema=fmt.json_schema or {"type": "object"})
    _check_output_schema(output)
    return output
