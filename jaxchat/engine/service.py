"""The serving pipeline shared by the HTTP server and `jaxchat.LLM`: OpenAI request in, OpenAI shapes out.

Contract: `ChatService(engine, ...)` implements the server's `ChatService` protocol. A chat request is
validated (`chat_constraint_request_from_openai`; `RequestError` means HTTP 400), rendered with the
model's own template, tokenised, given a prefill and a constraint built from the model's one
`ChatFormatSpec`, run through the engine, and read back by the same spec's parser: once for a plain
response, incrementally (`ChatStream`) for a stream, so both modes agree by construction. Leaving a
stream early aborts its engine requests. Generic sampling fields are assumed validated by the caller
(`jaxchat.server.validate`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from jaxchat.chat import (
    ChatParseOptions,
    ChatStream,
    ChatTemplate,
    RequestError,
    chat_constraint_request_from_openai,
    chat_finish_reason,
    chat_format_detect,
    chat_format_prefill,
    chat_parse,
)
from jaxchat.chat.detect import is_token_from_vocab
from jaxchat.chat.stream import new_tool_call_id
from jaxchat.engine import openai_shapes as shapes
from jaxchat.engine.types import GenerationRequest, SamplingParams

log = logging.getLogger("jaxchat")

PROMPT_TAIL_TOKENS = 32


def _generation_failed() -> dict:
    """The error item of a stream whose generation failed; details stay in the server log."""
    return {"error": {"message": "generation failed", "type": "server_error", "param": None, "code": None}}


def check_schemas(request) -> None:
    """Every JSON schema of the request is a valid schema (a 400 naming it otherwise)."""
    import jsonschema

    schemas = [(f"tools[{i}].function.parameters", t["function"]["parameters"]) for i, t in enumerate(request.tools)]
    if request.response_format == "json_schema" and request.json_schema is not None:
        schemas.append(("response_format.json_schema.schema", request.json_schema))
    for param, schema in schemas:
        try:
            jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise RequestError(param, f"invalid JSON schema: {exc.message}") from None


@dataclass
class PreparedChat:
    prompt_ids: list[int]
    prefill: str
    options: ChatParseOptions
    request: object  # ConstraintRequest
    sampling: SamplingParams
    n: int
    include_usage: bool


class ChatService:
    def __init__(self, engine, model_id: str, grammar=None, chat_template: str | None = None) -> None:
        self.engine = engine
        self.model_id = model_id
        self.tokenizer = engine.tokenizer
        self.max_context = engine.stats()["max_context"]
        source = chat_template or getattr(engine.model, "chat_template", None) or ""
        special = {"bos_token": self._token_text(getattr(self.tokenizer, "bos_token", None)),
                   "eos_token": self._token_text(getattr(self.tokenizer, "eos_token", None))}
        self.template = ChatTemplate(source, **special) if source else None
        vocab = self.tokenizer.get_vocab() if self.tokenizer is not None else {}
        self.spec = chat_format_detect(source, is_token_from_vocab(vocab.keys()))
        log.info("Chat format: %s", self.spec)
        self.grammar = grammar
        self.tools_enabled = bool(self.template and self.template.tools_enabled)
        self.stop_token_ids = tuple(
            t for marker in self.spec.extra_stops if (t := self._single_token(marker)) is not None
        )

    @staticmethod
    def _token_text(token) -> str:
        return token if isinstance(token, str) else ""

    def _single_token(self, text: str) -> int | None:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None

    # ---- preparing a request -------------------------------------------------------------------------
    def prepare_chat(self, body: dict) -> PreparedChat:
        request = chat_constraint_request_from_openai(body)
        check_schemas(request)
        tools = list(request.tools)
        if tools and not self.tools_enabled:
            if request.tool_choice == "required":
                raise RequestError("tool_choice", "this model's chat template does not render tools, so tool_choice 'required' or a named function cannot be honoured")
            tools = []
        if self.template is None:
            raise RequestError("messages", "this model has no chat template; use /v1/completions")
        kwargs = dict(request.chat_template_kwargs)
        kwargs.setdefault("enable_thinking", request.allow_reasoning)
        if request.reasoning_effort:
            kwargs.setdefault("reasoning_effort", request.reasoning_effort)
        prompt = self.template.render(body["messages"], tools=tools or None, add_generation_prompt=True, **kwargs)
        prompt_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        self._check_length(prompt_ids, "messages")
        tail = self.tokenizer.decode(prompt_ids[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
        prefill = chat_format_prefill(self.spec, tail)
        options = ChatParseOptions(parse_tool_calls=bool(tools) and request.tool_choice != "none", tools=tuple(tools))
        return PreparedChat(
            prompt_ids, prefill, options, request, self._sampling(body, len(prompt_ids)),
            int(body.get("n") or 1), bool((body.get("stream_options") or {}).get("include_usage")),
        )

    def _check_length(self, prompt_ids: list[int], param: str) -> None:
        if len(prompt_ids) >= self.max_context:
            raise RequestError(param, f"the prompt has {len(prompt_ids)} tokens, but the model's context is {self.max_context} tokens")

    def _sampling(self, body: dict, prompt_len: int) -> SamplingParams:
        room = self.max_context - prompt_len
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        stop = body.get("stop")
        logprobs = body.get("logprobs")
        return SamplingParams(
            max_tokens=min(int(asked), room) if asked else room,
            temperature=float(body.get("temperature") if body.get("temperature") is not None else 1.0),
            top_p=float(body.get("top_p") or 1.0),
            top_k=max(0, int(body.get("top_k") or 0)),
            min_p=float(body.get("min_p") or 0.0),
            presence_penalty=float(body.get("presence_penalty") or 0.0),
            frequency_penalty=float(body.get("frequency_penalty") or 0.0),
            repetition_penalty=float(body.get("repetition_penalty") or 1.0),
            seed=body.get("seed"),
            stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
            stop_token_ids=self.stop_token_ids,
            ignore_eos=bool(body.get("ignore_eos", False)),
            logprobs=int(body.get("top_logprobs") or 0) if logprobs else None,
        )

    def _constraint(self, prepared: PreparedChat):
        if self.grammar is None:
            return None
        try:
            return self.grammar.make(self.spec, prepared.request, prepared.prefill, tools_enabled=self.tools_enabled)
        except RequestError:
            raise
        except (RuntimeError, ValueError) as exc:  # xgrammar cannot compile what the request asks for
            param = "response_format" if prepared.request.response_format != "text" and not prepared.request.tools else "tools"
            raise RequestError(param, f"the request's JSON schemas cannot be compiled into a grammar: {exc}") from None

    def _requests(self, prepared: PreparedChat) -> list[GenerationRequest]:
        out = []
        for i in range(prepared.n):
            sampling = prepared.sampling
            if sampling.seed is not None and i:
                from dataclasses import replace

                sampling = replace(sampling, seed=sampling.seed + i)
            out.append(GenerationRequest(list(prepared.prompt_ids), sampling, self._constraint(prepared)))
        return out

    # ---- chat completions ----------------------------------------------------------------------------
    async def chat_completion(self, body: dict) -> dict:
        prepared = self.prepare_chat(body)
        results = await asyncio.gather(*(self._collect(r) for r in self._requests(prepared)))
        choices, completion_tokens, reasoning_tokens = [], 0, 0
        for index, (text, finish, n_tokens, logprobs) in enumerate(results):
            msg = chat_parse(self.spec, prepared.prefill + text, False, prepared.options)
            for call in msg.tool_calls:
                call.id = new_tool_call_id()
            completion_tokens += n_tokens
            reasoning_tokens += self._count_tokens(msg.reasoning_content)
            choices.append(shapes.chat_choice(index, msg, chat_finish_reason(msg, finish),
                                              shapes.logprobs_json(self.tokenizer, logprobs)))
        usage = shapes.usage(len(prepared.prompt_ids), completion_tokens, reasoning_tokens)
        return shapes.chat_completion(shapes.new_id("chatcmpl"), self.model_id, choices, usage)

    async def _collect(self, request: GenerationRequest):
        parts, finish, n_tokens, logprobs = [], None, 0, None
        async for out in self.engine.generate(request):
            parts.append(out.text)
            n_tokens = out.num_generated_tokens or n_tokens + len(out.token_ids)
            if out.logprobs:
                logprobs = (logprobs or []) + out.logprobs
            if out.finished:
                finish = out.finish_reason
                if finish == "error":
                    raise RuntimeError(f"generation failed: {out.error}")  # logged by the server, never sent
        return "".join(parts), finish, n_tokens, logprobs

    def _count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False)) if text else 0

    async def chat_completion_stream(self, body: dict) -> AsyncIterator[dict]:
        prepared = self.prepare_chat(body)  # raises before the first chunk
        factory = shapes.ChunkFactory(self.model_id, prepared.include_usage)
        requests = self._requests(prepared)
        queue: asyncio.Queue = asyncio.Queue()
        tasks = [asyncio.ensure_future(self._pump(i, r, queue)) for i, r in enumerate(requests)]
        streams = [ChatStream(self.spec, prepared.options) for _ in requests]
        for stream in streams:
            stream.update(prepared.prefill, False)
        completion_tokens, reasoning_tokens, done = 0, 0, 0
        try:
            for index in range(len(requests)):
                yield factory.delta(index, {"role": "assistant", "content": ""})
            while done < len(requests):
                index, out = await queue.get()
                if isinstance(out, BaseException):
                    yield _generation_failed()
                    return
                stream = streams[index]
                deltas = stream.update(out.text, out.finished and out.finish_reason != "error")
                logprobs = shapes.logprobs_json(self.tokenizer, out.logprobs)
                for delta in deltas:
                    yield factory.delta(index, shapes.delta_json(delta), logprobs=logprobs)
                    logprobs = None
                if not out.finished:
                    continue
                done += 1
                if out.finish_reason == "error":
                    log.error("request failed: %s", out.error)
                    yield _generation_failed()
                    return
                completion_tokens += out.num_generated_tokens
                reasoning_tokens += self._count_tokens(stream.parsed.reasoning_content)
                yield factory.delta(index, {}, chat_finish_reason(stream.parsed, out.finish_reason))
            if prepared.include_usage:
                yield factory.usage_chunk(shapes.usage(len(prepared.prompt_ids), completion_tokens, reasoning_tokens))
        finally:
            for task in tasks:
                task.cancel()

    async def _pump(self, index: int, request: GenerationRequest, queue: asyncio.Queue) -> None:
        try:
            async for out in self.engine.generate(request):
                queue.put_nowait((index, out))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failure of this request only
            log.exception("request failed")
            queue.put_nowait((index, exc))

    # ---- text completions ----------------------------------------------------------------------------
    def _prepare_completion(self, body: dict) -> tuple[list[int], SamplingParams, int]:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            ids = list(prompt)
        elif isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            raise RequestError("prompt", "prompt must be a string or a list of token ids")
        self._check_length(ids, "prompt")
        body = dict(body)
        if body.get("max_tokens") is None:
            body["max_tokens"] = 16
        return ids, self._sampling(body, len(ids)), int(body.get("n") or 1)

    async def completion(self, body: dict) -> dict:
        ids, sampling, n = self._prepare_completion(body)
        results = await asyncio.gather(*(self._collect(GenerationRequest(list(ids), sampling)) for _ in range(n)))
        choices = [{"index": i, "text": text, "logprobs": None, "finish_reason": finish} for i, (text, finish, _, _) in enumerate(results)]
        usage = shapes.usage(len(ids), sum(r[2] for r in results))
        return shapes.text_completion(shapes.new_id("cmpl"), self.model_id, choices, usage)

    async def completion_stream(self, body: dict) -> AsyncIterator[dict]:
        ids, sampling, _ = self._prepare_completion(body)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        rid = shapes.new_id("cmpl")
        generated = 0
        async for out in self.engine.generate(GenerationRequest(list(ids), sampling)):
            if out.finished and out.finish_reason == "error":
                log.error("request failed: %s", out.error)
                yield _generation_failed()
                return
            generated = out.num_generated_tokens or generated
            choice = {"index": 0, "text": out.text, "logprobs": None, "finish_reason": out.finish_reason if out.finished else None}
            yield shapes.text_completion(rid, self.model_id, [choice], None, chunk=True)
        if include_usage:
            yield shapes.text_completion(rid, self.model_id, [], shapes.usage(len(ids), generated), chunk=True)

    def stats(self) -> dict:
        s = self.engine.stats()
        return {
            "running": s["running"],
            "waiting": s["waiting"],
            "slots_total": s["max_batch"],
            "slots_busy": s["max_batch"] - s["free_slots"],
            "compiles": s["compile_count"],
        }


def model_id_for(path) -> str:
    """The name a model is served under: its file or directory name without quantisation suffixes."""
    from pathlib import Path

    name = Path(str(path)).name
    for suffix in (".gguf", "-q4_k_m", "-q4_1", "-Q4_K_M", ".Q4_1"):
        name = name.removesuffix(suffix)
    return name


def build_chat_service(model=None, *, max_batch: int = 8, max_context: int = 4096, dtype: str = "float32",
                       constrained: bool = True, **engine_kwargs) -> ChatService:
    """Load `model` (HF directory, GGUF file, orbax checkpoint; None = the default model), start an
    engine and a grammar engine for it, and return the serving pipeline."""
    from jaxchat.constrain import GrammarEngine
    from jaxchat.engine.engine import Engine

    if model is None:
        from jaxchat.assets import DEFAULT_MODEL, asset_path

        model = asset_path(DEFAULT_MODEL)
    engine = Engine.from_path(str(model), dtype=dtype, max_batch=max_batch, max_context=max_context, **engine_kwargs)
    grammar = GrammarEngine(engine.tokenizer, vocab_size=engine.model.config.vocab_size) if constrained else None
    return ChatService(engine, model_id_for(model), grammar)
