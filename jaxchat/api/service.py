"""The serving pipeline shared by the HTTP server and `jaxchat.LLM`: a typed request in, OpenAI shapes out.

Contract: `ChatService(engine, model_id, grammar=None)` takes requests already read by
`jaxchat.api.request` (`ChatRequest`, `CompletionRequest`); it never re-reads a request body. A chat
request is rendered with the model's own template, tokenised, given a prefill and a constraint built
from the model's one `ChatFormatSpec`, run through the engine, and read back by the same spec's
parser: once for a plain response, incrementally (`ChatStream`) for a stream, so both modes agree by
construction. Calls written in the format's call envelopes (fenced or bare JSON,
`jaxchat.chat.envelopes`) are read where `call_envelopes_on` says so, the rule the grammar's envelope
triggers follow. When tool calls are parsed, an output cut before the model ended its turn is read as the
stream read it (`jaxchat.api.cut`); under tool_choice "required" or named, `content` is null. The
400s that need the model are raised here, before any output: a template that cannot render tools
under `tool_choice` "required"/named or refuses the messages, no chat template, a prompt the tokenizer
cannot encode, one that is empty after tokenisation or does not fit the context. `chat_completion` / `completion` return the response dict
(with `usage`); `chat_completion_stream` / `completion_stream` return a `ChunkStream` whose `usage`
is set when the response is complete; errors found before the first chunk are raised on the first
`__anext__()`, a failure after it is one error chunk that ends the stream. Closing a stream early
aborts its engine requests. Text completions (`completion`, `completion_stream`, `generate`) are
`jaxchat.api.completions.TextCompletions`; the Responses API (`response`, `response_stream`) is
`jaxchat.api.responses.ResponsesApi`; the Anthropic Messages API (`messages`, `messages_stream`) is
`jaxchat.api.messages_api.MessagesApi`; `close()` stops the engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, replace

from jaxchat.api import shapes
from jaxchat.api.chat_run import ChatRun
from jaxchat.api.chunk_stream import ChunkStream
from jaxchat.api.completions import TextCompletions
from jaxchat.api.cut import cut_finish_reason, was_cut
from jaxchat.api.messages_api import MessagesApi
from jaxchat.api.request import ChatRequest, Sampling
from jaxchat.api.responses import ResponsesApi
from jaxchat.chat import (
    ChatMsg,
    ChatParseOptions,
    ChatTemplate,
    ConstraintRequest,
    RequestError,
    TemplateRefused,
    call_envelopes_on,
    chat_format_detect,
    chat_format_prefill,
    chat_parse,
)
from jaxchat.chat.detect import is_token_from_vocab
from jaxchat.chat.stream import new_tool_call_id
from jaxchat.engine.types import GenerationRequest, SamplingParams

log = logging.getLogger("jaxchat")

PROMPT_TAIL_TOKENS = 32


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


class ChatService(TextCompletions, ResponsesApi, MessagesApi):
    def __init__(self, engine, model_id: str, grammar=None, chat_template: str | None = None) -> None:
        self.engine = engine
        self.model_id = model_id
        self.tokenizer = engine.tokenizer
        self.max_context = engine.stats()["max_context"]
        source = chat_template or getattr(engine.model, "chat_template", None) or ""
        special = {"bos_token": _text(getattr(self.tokenizer, "bos_token", None)),
                   "eos_token": _text(getattr(self.tokenizer, "eos_token", None))}
        self.template = ChatTemplate(source, **special) if source else None
        vocab = self.tokenizer.get_vocab() if self.tokenizer is not None else {}
        self.spec = chat_format_detect(source, is_token_from_vocab(vocab.keys()), template_name=model_id)
        log.info("Chat format: %s", self.spec)
        self.grammar = grammar
        self.tools_enabled = bool(self.template and self.template.tools_enabled)
        self.stop_token_ids = tuple(
            t for marker in self.spec.extra_stops if (t := self._single_token(marker)) is not None
        )

    def expect_request(self):
        """A generation request is coming in (`Engine.expect_request`): the engine waits for it when gathering a
        burst, until the request is submitted or the returned arrival is closed. None when the engine gathers no
        bursts or has no `expect_request` (a scripted engine in tests)."""
        expect = getattr(self.engine, "expect_request", None)
        return expect() if expect is not None else None

    def _single_token(self, text: str) -> int | None:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None

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
        prompt_ids = self._checked_prompt(self._encode(prompt, "messages", False), "messages")
        tail = self.tokenizer.decode(prompt_ids[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
        options = ChatParseOptions(parse_tool_calls=bool(tools) and constraint.tool_choice != "none",
                                   tools=tuple(tools),
                                   call_envelopes=bool(tools) and call_envelopes_on(self.spec, constraint))
        return PreparedChat(tuple(prompt_ids), chat_format_prefill(self.spec, tail), options, constraint,
                            self._sampling(request.sampling, len(prompt_ids)), request.n)

    def _encode(self, text: str, param: str, special: bool) -> list[int]:
        try:
            return self.tokenizer.encode(text, add_special_tokens=special)
        except Exception as exc:  # noqa: BLE001 - `tokenizers` raises a bare Exception for text it cannot encode
            raise RequestError(param, f"the model's tokenizer cannot encode the {param}: {exc}") from None

    def _checked_prompt(self, prompt_ids: list[int], param: str) -> list[int]:
        if not prompt_ids:
            raise RequestError(param, f"the {param} tokenise to an empty prompt: send text that the model's "
                               "tokenizer encodes to at least one token")
        if len(prompt_ids) >= self.max_context:
            raise RequestError(param, f"the prompt has {len(prompt_ids)} tokens, but the model's context is "
                               f"{self.max_context} tokens")
        fits = getattr(self.engine, "prompt_fits", None)
        if fits is not None and not fits(len(prompt_ids)):
            raise RequestError(param, f"the prompt has {len(prompt_ids)} tokens, more than the server's KV cache "
                               "can ever hold (see jaxchat serve --kv-cache-gib)")
        return prompt_ids

    def _sampling(self, s: Sampling, prompt_len: int) -> SamplingParams:
        """The engine's parameters: `max_tokens` within the room the prompt leaves; the format's turn-end
        markers join the request's stop tokens unless `ignore_eos` asks for an exact length."""
        room = self.max_context - prompt_len
        stops = s.stop_token_ids if s.ignore_eos else tuple(dict.fromkeys(s.stop_token_ids + self.stop_token_ids))
        return SamplingParams(**{**asdict(s), "max_tokens": min(s.max_tokens, room) if s.max_tokens else room,
                                 "stop_token_ids": stops})

    def _constraint(self, prepared: PreparedChat):
        if self.grammar is None:
            return None
        try:
            return self.grammar.make(self.spec, prepared.constraint, prepared.prefill, tools_enabled=self.tools_enabled)
        except RequestError:
            raise
        except (RuntimeError, ValueError) as exc:  # xgrammar cannot compile what the request asks for
            c = prepared.constraint
            param = "response_format" if c.response_format != "text" and not c.tools else "tools"
            raise RequestError(param, f"the request's JSON schemas cannot be compiled into a grammar: {exc}") from None

    def _requests(self, prompt_ids, sampling: SamplingParams, n: int, constraint=None) -> list[GenerationRequest]:
        """n generation requests; each gets its own constraint (`constraint()`) and seed + index."""
        return [
            GenerationRequest(list(prompt_ids), replace(sampling, seed=sampling.seed + i) if sampling.seed is not None
                              and i else sampling, constraint() if constraint else None)
            for i in range(n)
        ]

    async def _collect(self, request: GenerationRequest) -> Generated:
        parts, tokens, finish, logprobs, n_tokens, stop_reason, cached = [], [], None, None, 0, None, 0
        async for out in self.engine.generate(request):
            cached = out.num_cached_tokens
            parts.append(out.text)
            tokens.extend(out.token_ids)
            n_tokens = out.num_generated_tokens or n_tokens + len(out.token_ids)
            if out.logprobs:
                logprobs = (logprobs or []) + out.logprobs
            if out.finished:
                finish, stop_reason = out.finish_reason, out.stop_reason
                if finish == "error":
                    raise RuntimeError(f"generation failed: {out.error}")  # logged by the server, never sent
        return Generated("".join(parts), tokens, finish, logprobs, n_tokens, stop_reason, cached)

    def _was_cut(self, request: ChatRequest, prepared: PreparedChat, finish: str | None, stop_reason) -> bool:
        """Whether to read the output as cut (`jaxchat.api.cut`): only when tool calls are parsed, so a
        plain reply keeps every character; logged once per choice."""
        turn_ends = (*self.stop_token_ids, *self.engine.eos_token_ids)
        cut = prepared.options.parse_tool_calls and was_cut(finish, stop_reason, request.sampling.stop_token_ids,
                                                            turn_ends)
        if cut:
            log.info("output cut before the end of the turn (finish_reason %s, stop %r): read as streamed",
                     finish, stop_reason)
        return cut

    def _count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    # ---- chat completions ----------------------------------------------------------------------------
    async def complete_chat(self, request: ChatRequest) -> tuple[PreparedChat, list[tuple[ChatMsg, str | None, Generated]]]:
        """Run every choice to its end and parse it once: (prepared, [(message, finish reason, result)])."""
        prepared = self.prepare_chat(request)
        gens = self._requests(prepared.prompt_ids, prepared.sampling, prepared.n, lambda: self._constraint(prepared))
        results = await asyncio.gather(*(self._collect(r) for r in gens))
        choices = []
        for result in results:
            cut = self._was_cut(request, prepared, result.finish_reason, result.stop_reason)
            msg = chat_parse(self.spec, prepared.prefill + result.text, cut, prepared.options)
            for call in msg.tool_calls:
                call.id = new_tool_call_id()
            choices.append((msg, cut_finish_reason(msg, result.finish_reason, cut), result))
        return prepared, choices

    async def chat_completion(self, request: ChatRequest) -> dict:
        prepared, results = await self.complete_chat(request)
        choices, completion_tokens, reasoning_tokens, cached_tokens = [], 0, 0, 0
        for index, (msg, finish, result) in enumerate(results):
            completion_tokens += result.num_tokens
            cached_tokens = max(cached_tokens, result.cached_tokens)
            reasoning_tokens += self._count_tokens(msg.reasoning_content)
            choices.append(shapes.chat_choice(index, msg, finish, shapes.logprobs_json(self.tokenizer, result.logprobs),
                                              calls_only=_calls_only(prepared)))
        usage = shapes.usage(len(prepared.prompt_ids), completion_tokens, reasoning_tokens, cached_tokens)
        return shapes.chat_completion(shapes.new_id("chatcmpl"), self.model_id, choices, usage)

    def chat_completion_stream(self, request: ChatRequest) -> ChunkStream:
        return ChunkStream(lambda stream: self._chat_chunks(request, stream))

    async def _chat_chunks(self, request: ChatRequest, stream: ChunkStream) -> AsyncIterator[dict]:
        run = ChatRun(self, request)  # raises before the first chunk
        factory = shapes.ChunkFactory(self.model_id, request.include_usage)
        completion_tokens, reasoning_tokens, cached_tokens = 0, 0, 0
        try:
            for index in range(len(run.parsers)):
                yield factory.delta(index, {"role": "assistant", "content": None if run.calls_only else ""})
            async for update in run.updates():
                logprobs = shapes.logprobs_json(self.tokenizer, update.logprobs)
                for delta in update.deltas:
                    yield factory.delta(update.index, shapes.delta_json(delta), logprobs=logprobs)
                    logprobs = None
                if update.failed:
                    yield shapes.generation_failed()
                    return
                if update.finished:
                    completion_tokens += update.num_tokens
                    reasoning_tokens += update.reasoning_tokens
                    cached_tokens = max(cached_tokens, update.cached_tokens)
                    yield factory.delta(update.index, {}, update.finish_reason)
            stream.usage = shapes.usage(run.prompt_tokens, completion_tokens, reasoning_tokens, cached_tokens)
            if request.include_usage:
                yield factory.usage_chunk(stream.usage)
        finally:
            run.cancel()

    async def _pump(self, index: int, request: GenerationRequest, queue: asyncio.Queue) -> None:
        try:
            async for out in self.engine.generate(request):
                queue.put_nowait((index, out))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failure of this request only
            log.exception("request failed")
            queue.put_nowait((index, exc))

    def close(self) -> None:
        """Stop the engine (idempotent)."""
        self.engine.shutdown()

    def stats(self) -> dict:
        s = self.engine.stats()
        return {
            "running": s["running"],
            "waiting": s["waiting"],
            "slots_total": s["max_batch"],
            "slots_busy": s["max_batch"] - s["free_slots"],
            "compiles": s["compile_count"],
            "compile_cache_hits": s.get("compile_cache_hits", 0),
            "programs_loaded": s.get("programs_loaded", 0),
            "prefix_cache_hit_tokens": s.get("prefix_cache_hit_tokens", 0),
            "jump_forward_tokens": s.get("jump_forward_tokens", 0),
            **{k: s[k] for k in ("kv_pages_used", "kv_pages_total", "preemptions", "draft_tokens",
                                 "draft_accepted_tokens") if k in s},
        }


def _calls_only(prepared: PreparedChat) -> bool:
    """tool_choice "required" or named: the reply is tool calls, so `content` is null."""
    return prepared.options.parse_tool_calls and prepared.constraint.tool_choice == "required"


def _text(token) -> str:
    return token if isinstance(token, str) else ""
