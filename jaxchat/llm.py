"""`jaxchat.LLM`: the in-process API for notebooks, on the same serving pipeline as the server.

Contract: `LLM(model=None)` loads a model (the default model when None) and runs its engine;
`.chat(messages, tools=..., tool_choice=..., response_format=..., stream=False)` returns the same
`chat.completion` dict the server returns (or, with `stream=True`, an iterator of the same chunk
dicts); `.generate(prompt, max_tokens=..., temperature=0.0, ignore_eos=False)` returns a `Completion`
with `.text` and `.token_ids`. Requests are validated exactly as the server validates them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str | None


class LLM:
    def __init__(self, model=None, *, max_batch: int = 4, max_context: int = 4096, dtype: str = "float32", **kwargs) -> None:
        from jaxchat.engine.service import build_chat_service

        self.service = build_chat_service(model, max_batch=max_batch, max_context=max_context, dtype=dtype, **kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="jaxchat-llm", daemon=True)
        self._thread.start()

    @property
    def chat_format(self) -> str:
        """The detected chat format, e.g. `hermes_json`."""
        return str(self.service.spec)

    @property
    def model_id(self) -> str:
        return self.service.model_id

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _body(self, messages, **fields) -> dict:
        from jaxchat.server.validate import validate_chat_body

        body = {"model": self.model_id, "messages": messages, **{k: v for k, v in fields.items() if v is not None}}
        return validate_chat_body(body, max_context=self.service.max_context)

    def chat(self, messages, tools=None, tool_choice=None, response_format=None, stream: bool = False, **kwargs):
        body = self._body(messages, tools=tools, tool_choice=tool_choice, response_format=response_format, **kwargs)
        if not stream:
            return self._run(self.service.chat_completion(body))
        return self._stream(body)

    def _stream(self, body: dict) -> Iterator[dict]:
        agen = self.service.chat_completion_stream(body)
        try:
            while True:
                try:
                    chunk = self._run(agen.__anext__())
                except StopAsyncIteration:
                    return
                yield chunk
        finally:
            self._run(agen.aclose())

    def generate(self, prompt: str | list[int], max_tokens: int = 64, temperature: float = 0.0,
                 ignore_eos: bool = False, **sampling) -> Completion:
        from jaxchat.engine.types import GenerationRequest, SamplingParams

        tokenizer = self.service.tokenizer
        ids = list(prompt) if isinstance(prompt, list) else tokenizer.encode(prompt, add_special_tokens=True)
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=ignore_eos, **sampling)

        async def collect() -> Completion:
            text, tokens, finish = [], [], None
            async for out in self.service.engine.generate(GenerationRequest(ids, params)):
                text.append(out.text)
                tokens.extend(out.token_ids)
                finish = out.finish_reason if out.finished else finish
            return Completion("".join(text), tokens, finish)

        return self._run(collect())

    def close(self) -> None:
        self.service.engine.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
