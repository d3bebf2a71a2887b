"""The serving pipeline every wire API runs on: template, tokenizer, constraint, engine and parser, once per model.

Contract: `ChatPipeline(engine, model_id, grammar=None, chat_template=None)` holds what a model's requests
share: its `engine` (a `ServingEngine`, checked with `isinstance`), `tokenizer`, the `template`
(`ChatTemplate`, None when the model has none), the one `ChatFormatSpec` (`spec`) detected from the template
and the vocabulary, the grammar engine (`grammar`, None for unconstrained decoding) and the format's
turn-end token ids (`stop_token_ids`). Its public methods are the steps the wire API adapters
(`openai.chat_completions`, `openai.completions`, `responses.adapter`, `anthropic.adapter`) compose:
`prepare_chat` renders and
tokenises a `ChatRequest` and raises every 400 that needs the model (no chat template, a template that
refuses the messages or cannot render tools under tool_choice "required"/named, a prompt the tokenizer
cannot encode, one that is empty or does not fit the context or the KV pool); `encode` / `checked_prompt` /
`sampling` do the same for a completion's prompt; `compile_grammars` compiles, off the event loop, every
grammar that those steps and `constraint` then find cached (a server awaits it first); `check_output` refuses a structured-output field that cannot
be enforced (400); `constraint` builds one choice's grammar constraint (a schema xgrammar cannot compile is a
400); `requests` makes the `n` engine requests; `outputs` runs one
(a chat request's reply that opens with a call envelope goes on in the format's own call syntax:
`jaxchat.api.envelope_restart`), `collect` runs one to its end (`Generated`), `pump` forwards its deltas to a
queue; `was_cut` says whether to read an output as cut
(`jaxchat.api.cut`); `complete_chat` runs every choice and parses each once. `expect_request`, `stats` and
`close` are the engine's announcement, the server's gauges and shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol, runtime_checkable

from jaxchat.api.cut import cut_finish_reason, was_cut
from jaxchat.api.envelope_restart import RestartPlan, restarted
from jaxchat.api.request import ChatRequest, Sampling
from jaxchat.chat import (
    ChatFormatSpec,
    ChatMsg,
    ChatParseOptions,
    ChatTemplate,
    ConstraintRequest,
    RequestError,
    TemplateRefused,
    call_envelopes_on,
    chat_format_detect,
    chat_format_make,
    chat_format_prefill,
    chat_parse,
    native_call_opening,
)
from jaxchat.chat.detect import is_token_from_vocab
from jaxchat.chat.stream import new_tool_call_id
from jaxchat.chat.structured import OutputConstraint
from jaxchat.engine.types import EngineStats, GenerationOutput, GenerationRequest, SamplingParams

__all__ = ["ChatPipeline", "Generated", "PreparedChat", "ServingEngine", "calls_only", "special_tokens"]

log = logging.getLogger("jaxchat")

PROMPT_TAIL_TOKENS = 32
PLAIN_SPEC = chat_format_make("plain")  # how a completion's constrained output is read: text, no markers


@runtime_checkable
class ServingEngine(Protocol):
    """What the pipeline needs of an engine (`jaxchat.engine.Engine`; tests use scripted ones). `model` has a
    `chat_template` (str or None); `tokenizer` is a transformers tokenizer (None only for a model served
    without one, which then has no chat API)."""

    model: Any
    tokenizer: Any
    eos_token_ids: tuple[int, ...]
    max_context: int  # the most tokens a request may hold (prompt + output)

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationOutput]: ...

    def expect_request(self) -> Any: ...  # an object with `close()`, or None when the engine gathers no bursts

    def prompt_fits(self, tokens: int) -> bool: ...

    def stats(self) -> EngineStats: ...

    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class PreparedChat:
    prompt_ids: tuple[int, ...]
    prefill: str
    options: ChatParseOptions
    constraint: ConstraintRequest
    sampling: SamplingParams
    n: int


@dataclass(frozen=True)
class Generated:
    """One finished generation: its text, token ids, finish reason and logprobs (None when not asked)."""

    text: str
    token_ids: list[int]
    finish_reason: str | None
    logprobs: list | None
    num_tokens: int  # generated tokens, counting any whose text a stop string cut
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    cached_tokens: int = 0  # prompt tokens reused from the engine's prefix cache


def special_tokens(tokenizer) -> dict[str, str]:
    """The `bos_token` / `eos_token` a chat template may use ("" when the tokenizer has none)."""
    if tokenizer is None:
        return {"bos_token": "", "eos_token": ""}
    return {"bos_token": _text(tokenizer.bos_token), "eos_token": _text(tokenizer.eos_token)}


def calls_only(prepared: PreparedChat) -> bool:
    """tool_choice "required" or named: the reply is tool calls, so a chat `content` is null."""
    return prepared.options.parse_tool_calls and prepared.constraint.tool_choice == "required"


class ChatPipeline:
    def __init__(self, engine: ServingEngine, model_id: str, grammar=None, chat_template: str | None = None) -> None:
        if not isinstance(engine, ServingEngine):
            raise TypeError(f"{type(engine).__name__} is not a ServingEngine (jaxchat.api.pipeline)")
        self.engine = engine
        self.model_id = model_id
        self.tokenizer = engine.tokenizer
        self.max_context: int = engine.max_context
        source = chat_template or engine.model.chat_template or ""
        self.template = ChatTemplate(source, **special_tokens(self.tokenizer)) if source else None
        vocab = self.tokenizer.get_vocab() if self.tokenizer is not None else {}
        self.spec = chat_format_detect(source, is_token_from_vocab(vocab.keys()), template_name=model_id)
        log.info("Chat format: %s", self.spec)
        self.grammar = grammar
        self.tools_enabled = bool(self.template and self.template.tools_enabled)
        self.stop_token_ids = tuple(
            t for marker in self.spec.extra_stops if (t := self.single_token(marker)) is not None
        )

    def single_token(self, text: str) -> int | None:
        """The id of `text` when it is one token of the vocabulary, else None."""
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None

    def expect_request(self):
        """A generation request is coming in (`Engine.expect_request`): the engine waits for it when gathering a
        burst, until the request is submitted or the returned arrival is closed. None when it gathers none."""
        return self.engine.expect_request()

    # ---- preparing a request -------------------------------------------------------------------------
    def prepare_chat(self, request: ChatRequest) -> PreparedChat:
        constraint = request.constraint
        tools = list(constraint.tools)
        if tools and not self.tools_enabled:
            if constraint.tool_choice == "required":
                raise RequestError("tool_choice", "this model's chat template does not render tools, so "
                                   "tool_choice 'required' or a named function cannot be honoured")
            tools = []
        if self.template is None:
            raise RequestError("messages", "this model has no chat template; use /v1/completions")
        kwargs = dict(constraint.chat_template_kwargs)
        kwargs.setdefault("enable_thinking", constraint.allow_reasoning)
        if constraint.reasoning_effort:
            kwargs.setdefault("reasoning_effort", constraint.reasoning_effort)
        try:
            prompt = self.template.render(list(request.messages), tools=tools or None, add_generation_prompt=True,
                                          **kwargs)
        except TemplateRefused as exc:  # e.g. roles that do not alternate; the template's own failures are 500s
            raise RequestError("messages", f"the model's chat template cannot render these messages: {exc}") from None
        prompt_ids = self.checked_prompt(self.encode(prompt, "messages", False), "messages")
        self.check_output(constraint.output)
        if any(t.get("custom") for t in tools):
            if self.grammar is None:
                raise RequestError("tools", "this server runs without constrained decoding (--no-constrain), so "
                                   "custom tools' grammars cannot be honoured")
            self.grammar.check_custom_tools(tools)
        tail = self.tokenizer.decode(prompt_ids[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
        options = ChatParseOptions(parse_tool_calls=bool(tools) and constraint.tool_choice != "none",
                                   tools=tuple(tools),
                                   call_envelopes=bool(tools) and call_envelopes_on(self.spec, constraint))
        return PreparedChat(tuple(prompt_ids), chat_format_prefill(self.spec, tail), options, constraint,
                            self.sampling(request.sampling, len(prompt_ids)), request.n)

    def encode(self, text: str, param: str, special: bool) -> list[int]:
        """`text`'s token ids; text the tokenizer cannot encode is a 400 naming `param`."""
        try:
            return self.tokenizer.encode(text, add_special_tokens=special)
        except Exception as exc:  # noqa: BLE001 - `tokenizers` raises a bare Exception for text it cannot encode
            raise RequestError(param, f"the model's tokenizer cannot encode the {param}: {exc}") from None

    def checked_prompt(self, prompt_ids: list[int], param: str) -> list[int]:
        """`prompt_ids` unchanged, or a 400 naming `param`: empty, no room in the context, or never fits the KV pool."""
        if not prompt_ids:
            raise RequestError(param, f"the {param} tokenise to an empty prompt: send text that the model's "
                               "tokenizer encodes to at least one token")
        if len(prompt_ids) >= self.max_context:
            raise RequestError(param, f"the prompt has {len(prompt_ids)} tokens, but the model's context is "
                               f"{self.max_context} tokens")
        if not self.engine.prompt_fits(len(prompt_ids)):
            raise RequestError(param, f"the prompt has {len(prompt_ids)} tokens, more than the server's KV cache "
                               "can ever hold (see jaxchat serve --kv-cache-gib)")
        return prompt_ids

    def sampling(self, s: Sampling, prompt_len: int) -> SamplingParams:
        """The engine's parameters for a request (`engine_sampling`) within the room the prompt leaves."""
        vocab = self.grammar.vocab_size if self.grammar is not None else len(self.tokenizer)
        return engine_sampling(s, self.max_context - prompt_len, vocab, self.stop_token_ids)

    async def compile_grammars(self, constraint: ConstraintRequest, spec: ChatFormatSpec | None = None) -> None:
        """Compile every grammar that checking and constraining a request with `constraint` needs (in the format
        `spec`, the model's by default) on the grammar engine's threads, so the event loop keeps serving while they
        compile (each bounded by the engine's time limit) and the synchronous steps after it find them cached.
        Raises nothing: what cannot be compiled is cached as such, and those steps raise their 400s in order."""
        if self.grammar is None or not (constraint.tools or constraint.output is not None
                                        or constraint.response_format != "text"):
            return  # nothing to compile (`chat_structural_tag` is None): no thread hop
        try:
            tags = await asyncio.to_thread(self.grammar.request_tags, spec or self.spec, constraint, self.tools_enabled)
        except Exception:  # noqa: BLE001 - raised again, in its place, by prepare_chat / constraint
            return
        await asyncio.gather(*(self.grammar.compile_async(tag) for tag in tags), return_exceptions=True)

    async def compile_output(self, output: OutputConstraint | None) -> None:
        """`compile_grammars` for a completion's `output` (read as plain text)."""
        if output is not None:
            await self.compile_grammars(ConstraintRequest(output=output), PLAIN_SPEC)

    def check_output(self, output: OutputConstraint | None) -> None:
        """A 400 naming the field unless `output` (a structured-output field) can be enforced: it needs the grammar
        engine, and its regex, choice or grammar must compile and admit some text."""
        if output is None:
            return
        if self.grammar is None:
            raise RequestError(output.param, "this server runs without constrained decoding (--no-constrain), so "
                               f"{output.param} cannot be honoured")
        self.grammar.check_output(output)

    def constraint(self, prepared: PreparedChat, spec: ChatFormatSpec | None = None):
        """One choice's grammar constraint (None without a grammar engine); `spec` replaces the model's format
        (a completion's output is read as plain text)."""
        if self.grammar is None:
            return None
        try:
            return self.grammar.make(spec or self.spec, prepared.constraint, prepared.prefill,
                                     tools_enabled=self.tools_enabled)
        except RequestError:
            raise
        except (RuntimeError, ValueError) as exc:  # xgrammar cannot compile what the request asks for
            c = prepared.constraint
            param = c.output.param if c.output is not None else \
                "response_format" if c.response_format != "text" and not c.tools else "tools"
            raise RequestError(param, f"the request's constraint cannot be compiled into a grammar: "
                               f"{exc}") from None

    def output_constraint(self, output: OutputConstraint):
        """A completion's constraint for `output` (checked by `check_output`), the text read as plain."""
        if self.grammar is None:
            return None
        prepared = PreparedChat((), "", ChatParseOptions(), ConstraintRequest(output=output), SamplingParams(), 1)
        return self.constraint(prepared, PLAIN_SPEC)

    def requests(self, prompt_ids, sampling: SamplingParams, n: int,
                 constraint: Callable[[], Any] | None = None) -> list[GenerationRequest]:
        """n generation requests; each gets its own constraint (`constraint()`) and seed + index."""
        return [
            GenerationRequest(list(prompt_ids), replace(sampling, seed=sampling.seed + i) if sampling.seed is not None
                              and i else sampling, constraint() if constraint else None)
            for i in range(n)
        ]

    def chat_requests(self, prepared: PreparedChat) -> list[GenerationRequest]:
        """A prepared chat's `n` engine requests, each with its own constraint."""
        return self.requests(prepared.prompt_ids, prepared.sampling, prepared.n, lambda: self.constraint(prepared))

    # ---- running ---------------------------------------------------------------------------------------
    def outputs(self, request: GenerationRequest, prepared: PreparedChat | None = None) -> AsyncIterator[GenerationOutput]:
        """The engine's deltas for `request`; for a chat request (`prepared`) whose reply may open with a call
        envelope, through `envelope_restart.restarted`."""
        plan = self.restart_plan(prepared, request) if prepared is not None else None
        return restarted(self.engine, request, plan) if plan is not None else self.engine.generate(request)

    def restart_plan(self, prepared: PreparedChat, request: GenerationRequest) -> RestartPlan | None:
        """How a reply that opens with a call envelope restarts in the format's own syntax; None when it does
        not (no envelopes read, a prefill before the reply, logprobs asked, a format without such an opening)."""
        options = prepared.options
        if not options.call_envelopes or prepared.prefill or request.sampling.logprobs is not None:
            return None
        if native_call_opening(self.spec, "tool") is None:
            return None

        calls_only_request = replace(prepared.constraint, tool_choice="required")

        async def prepare() -> None:  # the calls-only grammar, compiled on the grammar engine's threads
            await self.compile_grammars(calls_only_request)

        async def constraint(opening: str):
            if self.grammar is None:
                return None
            await prepare()  # cached by now, or still compiling: waited for without blocking the loop
            return self.grammar.make(self.spec, calls_only_request, prepared.prefill + opening,
                                     tools_enabled=self.tools_enabled)

        return RestartPlan(options.tool_names(), lambda name: native_call_opening(self.spec, name),
                           lambda text: self.tokenizer.encode(text, add_special_tokens=False), constraint,
                           (self.spec.tool_start, self.spec.tool_end), self.engine.prompt_fits, prepare)

    async def collect(self, request: GenerationRequest, prepared: PreparedChat | None = None) -> Generated:
        """Run `request` to its end (`outputs`); a failed generation raises (logged by the server, never sent)."""
        parts, tokens, finish, logprobs, n_tokens, stop_reason, cached = [], [], None, None, 0, None, 0
        async for out in self.outputs(request, prepared):
            cached = out.num_cached_tokens
            parts.append(out.text)
            tokens.extend(out.token_ids)
            n_tokens = out.num_generated_tokens or n_tokens + len(out.token_ids)
            if out.logprobs:
                logprobs = (logprobs or []) + out.logprobs
            if out.finished:
                finish, stop_reason = out.finish_reason, out.stop_reason
                if finish == "error":
                    raise RuntimeError(f"generation failed: {out.error}")
        return Generated("".join(parts), tokens, finish, logprobs, n_tokens, stop_reason, cached)

    async def pump(self, index: int, request: GenerationRequest, queue: asyncio.Queue,
                   prepared: PreparedChat | None = None) -> None:
        """Put `(index, output)` on `queue` for each of the request's deltas (`outputs`), or `(index, exception)`
        once if it fails; run it as a task and cancel the task to abort the request."""
        try:
            async for out in self.outputs(request, prepared):
                queue.put_nowait((index, out))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failure of this request only
            log.exception("request failed")
            queue.put_nowait((index, exc))

    def was_cut(self, request: ChatRequest, prepared: PreparedChat, finish: str | None, stop_reason) -> bool:
        """Whether to read the output as cut (`jaxchat.api.cut`): only when tool calls are parsed, so a
        plain reply keeps every character; logged once per choice."""
        turn_ends = (*self.stop_token_ids, *self.engine.eos_token_ids)
        cut = prepared.options.parse_tool_calls and was_cut(finish, stop_reason, request.sampling.stop_token_ids,
                                                            turn_ends)
        if cut:
            log.info("output cut before the end of the turn (finish_reason %s, stop %r): read as streamed",
                     finish, stop_reason)
        return cut

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    async def complete_chat(self, request: ChatRequest) -> tuple[PreparedChat, list[tuple[ChatMsg, str | None, Generated]]]:
        """Run every choice to its end and parse it once: (prepared, [(message, finish reason, result)])."""
        await self.compile_grammars(request.constraint)
        prepared = self.prepare_chat(request)
        results = await asyncio.gather(*(self.collect(r, prepared) for r in self.chat_requests(prepared)))
        choices = []
        for result in results:
            cut = self.was_cut(request, prepared, result.finish_reason, result.stop_reason)
            msg = chat_parse(self.spec, prepared.prefill + result.text, cut, prepared.options)
            for call in msg.tool_calls:
                call.id = new_tool_call_id()
            choices.append((msg, cut_finish_reason(msg, result.finish_reason, cut), result))
        return prepared, choices

    # ---- the engine ------------------------------------------------------------------------------------
    def close(self) -> None:
        """Stop the engine (idempotent)."""
        self.engine.shutdown()

    def stats(self) -> dict:
        return service_stats(self.engine.stats())


def engine_sampling(s: Sampling, room: int, vocab: int, turn_ends: tuple[int, ...]) -> SamplingParams:
    """The engine's parameters: `max_tokens` within `room` (what the context leaves after the prompt); the format's
    turn-end tokens join the request's stop tokens unless `ignore_eos` asks for an exact length; a `logit_bias` id
    outside the vocabulary is a 400."""
    for token, _ in s.logit_bias:
        if token >= vocab:
            raise RequestError(f"logit_bias.{token}", f"token id {token} is not in the model's vocabulary "
                               f"(ids 0..{vocab - 1})")
    stops = s.stop_token_ids if s.ignore_eos else tuple(dict.fromkeys(s.stop_token_ids + turn_ends))
    return SamplingParams(**{**asdict(s), "max_tokens": min(s.max_tokens, room) if s.max_tokens else room,
                             "stop_token_ids": stops})


def service_stats(s: EngineStats) -> dict:
    """The server's gauges (`jaxchat.server.metrics`, `/health`) from the engine's stats."""
    return {
        "running": s.running,
        "waiting": s.waiting,
        "slots_total": s.max_batch,
        "slots_busy": s.max_batch - s.free_slots,
        "compiles": s.compile_count,
        "compile_cache_hits": s.compile_cache_hits,
        "programs_loaded": s.programs_loaded,
        "programs_ready": s.programs_ready,
        "programs_total": s.programs_total,
        "compiles_on_request_path": s.compiles_on_request_path,
        "prefix_cache_hit_tokens": s.prefix_cache_hit_tokens,
        "jump_forward_tokens": s.jump_forward_tokens,
        "kv_pages_used": s.kv_pages_used,
        "kv_pages_total": s.kv_pages_total,
        "preemptions": s.preemptions,
        "draft_tokens": s.draft_tokens,
        "draft_accepted_tokens": s.draft_accepted_tokens,
    }


def _text(token) -> str:
    return token if isinstance(token, str) else ""
