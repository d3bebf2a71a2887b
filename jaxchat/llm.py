"""`jaxchat.LLM`: the in-process API for notebooks, on the same serving pipeline as the server.

Contract: `LLM(model=None, config=None, limits=Limits(), data_parallel=None, **settings)` loads a model (the default
model when None) and runs its engine as `config` (`jaxchat.engine.config.EngineConfig`: by default the same
settings `jaxchat serve` runs with) with `settings` (its fields: `max_batch`, `quantize` "int8" for int8 weights,
`speculative`, ...) changed (`data_parallel` N: N replicas over 1/N of the
devices each, requests spread over them; a bad N is a ValueError; None: 1 off TPU, see `jaxchat.engine.replicas`); `.chat(messages, tools=..., tool_choice=..., response_format=..., stream=False)` returns the
same `chat.completion` dict the server returns (or, with `stream=True`, an iterator of the same chunk
dicts); `.generate(prompt, max_tokens=..., temperature=0.0, ignore_eos=False)` returns a `Completion`
with `.text` and `.token_ids` (its other keyword arguments are the sampling fields of
`jaxchat.api.Sampling`; any other is a TypeError). Requests are read by the same `jaxchat.api` readers, with the same
`Limits`, as the server's, so a bad call raises `jaxchat.chat.RequestError` naming the field.
The step programs are kept in the executable store `jaxchat serve` uses (`executable_cache=DIR` elsewhere, None
for none), so a program compiled by one is loaded by the other. As under `jaxchat serve`, the engine answers once
its first programs are ready and compiles the others in the background (`programs="all"`: all first; "first":
the first set only; the default also comes from `JAXCHAT_PROGRAMS`, as for `jaxchat serve --programs`).
`LLM.from_service(service)` wraps an already built pipeline. `.close()`, leaving a `with LLM(...)` block, or
dropping the last reference (a finaliser) stops the engine's thread and releases its device buffers and compiled
programs, so a notebook can build and drop models for as long as it likes. Only `jaxchat.api` is used: no
starlette.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, fields

from jaxchat.api import (
    ChatService,
    Limits,
    Sampling,
    build_chat_service,
    default_executable_cache,
    parse_chat_request,
    parse_completion_request,
)

# `generate`'s keyword arguments beyond its named ones: the sampling fields (stop, seed, top_p, ...)
GENERATE_OPTIONS = frozenset(f.name for f in fields(Sampling)) - {"max_tokens", "temperature", "ignore_eos", "logprobs"}


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str | None


class LLM:
    def __init__(self, model=None, config=None, *, limits: Limits | None = None, data_parallel: int | None = None,
                 **settings) -> None:
        # the step programs go to (and come from) the executable store `jaxchat serve` uses, unless told otherwise
        if "executable_cache" not in settings and (config is None or config.executable_cache is None):
            settings["executable_cache"] = default_executable_cache()
        self._start(build_chat_service(model, config, data_parallel=data_parallel, **settings), limits)

    @classmethod
    def from_service(cls, service: ChatService, limits: Limits | None = None) -> LLM:
        llm = cls.__new__(cls)
        llm._start(service, limits)
        return llm

    def _start(self, service: ChatService, limits: Limits | None) -> None:
        self.service = service
        self.limits = limits or Limits()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="jaxchat-llm", daemon=True)
        self._thread.start()
        # closing, leaving a `with` block or dropping the last reference: the engine's thread, device buffers
        # and programs are released, and the event loop's thread ends
        self._finalizer = weakref.finalize(self, _close, service, self._loop, self._thread)

    @property
    def chat_format(self) -> str:
        """The detected chat format, e.g. `hermes_json`."""
        return str(self.service.spec)

    @property
    def model_id(self) -> str:
        return self.service.model_id

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def chat(self, messages, tools=None, tool_choice=None, response_format=None, stream: bool = False, **kwargs):
        body = {"messages": messages, "tools": tools, "tool_choice": tool_choice, "response_format": response_format,
                "stream": stream, **kwargs}
        request = parse_chat_request(body, self.limits, self.service.max_context)
        if not stream:
            return self._run(self.service.chats.answer(request))
        return self._stream(request)

    def _stream(self, request) -> Iterator[dict]:
        chunks = self.service.chats.stream(request)
        try:
            while True:
                try:
                    chunk = self._run(chunks.__anext__())
                except StopAsyncIteration:
                    return
                yield chunk
        finally:
            self._run(chunks.aclose())

    def generate(self, prompt: str | list[int], max_tokens: int = 64, temperature: float = 0.0,
                 ignore_eos: bool = False, **sampling) -> Completion:
        unknown = sorted(set(sampling) - GENERATE_OPTIONS)
        if unknown:
            raise TypeError(f"generate() got unexpected keyword arguments {unknown}; it takes {sorted(GENERATE_OPTIONS)}")
        body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": temperature, "ignore_eos": ignore_eos,
                **sampling}
        request = parse_completion_request(body, self.limits, self.service.max_context)
        result = self._run(self.service.texts.generate(request))
        return Completion(result.text, result.token_ids, result.finish_reason)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _close(service: ChatService, loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    service.close()
    if not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)
    if thread is not threading.current_thread():
        thread.join(timeout=30)
    if not thread.is_alive() and not loop.is_closed():
        loop.close()
