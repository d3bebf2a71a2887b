"""The grammar engine: one per model. xgrammar tokenizer info, compiler, compiled-grammar cache.

Contract:
- `GrammarEngine(tokenizer, vocab_size=None, stop_token_ids=None)` reads the vocabulary of a
  transformers tokenizer (or of a tiktoken-style encoding with `decode_single_token_bytes`), pads
  it to `vocab_size` (the model's logits size), and logs `Grammar engine ready in N ms`. Stop tokens
  that some format's grammar matches as text (`<|call|>`, `<|return|>`, `<|end|>`) are kept out of
  xgrammar's stop list.
- `compile(tag)` compiles a structural tag once; later calls with the same tag JSON are a dict hit (an LRU of
  `cache_size`; a tag xgrammar refuses is cached too, as its error). The compile runs on a daemon thread, one
  per tag however many requests wait for it; `compile_async(tag)` awaits it without blocking the event loop.
  A compile that takes longer than `compile_timeout_s` raises `GrammarTimeout` (a RuntimeError) and is left
  to finish on its thread; the same tag is then refused at once (no second thread). xgrammar's own errors come
  out as `GrammarError` (a RuntimeError) carrying its message without its log prefix. Thread-safe.
- `request_tags(spec, request, tools_enabled)` lists every tag that checking and constraining a request
  compiles (what a server compiles off its event loop first, `compile_async`, so that the synchronous steps
  after it find them cached).
- `matches_nothing(tag)`: whether the tag's grammar admits no text at all (an empty first token mask that
  cannot end, or a root with no finite derivation: `jaxchat.constrain.emptiness`), cached with the grammar.
- `check_output(output)` compiles an `OutputConstraint`'s regex / choice / grammar alone and raises
  `RequestError(output.param, compiler message)` when xgrammar cannot compile it, it times out, or it admits
  no text at all; `check_custom_tools(tools)` does the same for custom tools' grammars, naming
  `tools[i].custom.format.grammar.definition`.
- `make(spec, request, prefill)` returns the request's constraint (`GrammarConstraint`,
  `TokenBanConstraint` or None, see `chat_make_constraint`), already started with the prefill.
- `accepts(spec, request, prefill, text)` feeds a whole output through the grammar byte by byte and
  returns `(True, len(text_bytes))`, or `(False, byte_offset_in_text)` where it fails (the length
  when the text is a valid but unfinished prefix).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from dataclasses import replace

import xgrammar as xgr

from jaxchat.chat import ChatFormatSpec, ConstraintRequest, RequestError
from jaxchat.chat.request_tools import custom_format
from jaxchat.chat.structured import OutputConstraint
from jaxchat.constrain.constraint import GrammarConstraint, TokenBanConstraint, token_ban_constraint
from jaxchat.constrain.custom_tools import check_custom_tools, custom_arguments
from jaxchat.constrain.emptiness import matches_nothing
from jaxchat.constrain.output import compiler_message, output_format
from jaxchat.constrain.tags import TEXT_MARKERS, chat_structural_tag, guarded_markers, text_markers

log = logging.getLogger("jaxchat")
_ALL_TEXT_MARKERS = frozenset(m for ms in TEXT_MARKERS.values() for m in ms)


def _vocab_and_eos(tokenizer):
    """(xgrammar TokenizerInfo builder, default stop ids, tokenizer vocab length)."""
    if hasattr(tokenizer, "get_vocab"):
        eos = tokenizer.eos_token_id
        return "hf", [eos] if isinstance(eos, int) else list(eos or []), len(tokenizer.get_vocab())
    if hasattr(tokenizer, "decode_single_token_bytes"):
        n = tokenizer.n_vocab
        return "bytes", [tokenizer.eot_token], n
    raise TypeError(f"unsupported tokenizer {type(tokenizer).__name__}: needs get_vocab() or decode_single_token_bytes()")


class GrammarError(RuntimeError):
    """xgrammar cannot compile a grammar; the message is the compiler's."""


class GrammarTimeout(RuntimeError):
    """A grammar took longer than the engine's `compile_timeout_s` to compile."""


def tokenizer_info(tokenizer, vocab_size: int | None, stop_token_ids) -> tuple[xgr.TokenizerInfo, list[int], list[int]]:
    """(xgrammar's tokenizer info padded to `vocab_size` (default: the tokenizer's), the stop ids (default: the
    tokenizer's eos), the stop ids xgrammar is told of: those that are no text marker a format writes)."""
    kind, default_stops, n_tok = _vocab_and_eos(tokenizer)
    vocab_size = int(vocab_size or n_tok)
    decoded: list[bytes] = []
    if kind == "bytes":
        for i in range(n_tok):
            try:
                decoded.append(tokenizer.decode_single_token_bytes(i))
            except (KeyError, ValueError, RuntimeError):  # holes in the id space decode to nothing
                decoded.append(b"")

    def text_of(i: int) -> str:
        if kind == "bytes":
            return decoded[i].decode("utf-8", "replace") if 0 <= i < len(decoded) else ""
        return tokenizer.convert_ids_to_tokens(i) or ""

    stops = [int(s) for s in (stop_token_ids if stop_token_ids is not None else default_stops)]
    kept = [s for s in stops if text_of(s) not in _ALL_TEXT_MARKERS] or stops[:1]
    if kind == "hf":
        return _hf_tokenizer_info(tokenizer, vocab_size, kept), stops, kept
    return xgr.TokenizerInfo(decoded, xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=kept), stops, kept


def _xgrammar_version() -> str:
    from importlib.metadata import version

    return version("xgrammar")


def _hf_tokenizer_info(tokenizer, vocab_size: int, stop_ids: list[int]) -> xgr.TokenizerInfo:
    """xgrammar's `TokenizerInfo.from_huggingface` (0.57 s for a 150k vocabulary here, mostly Python: a start's
    grammar engine holds the GIL that long), kept on disk by content: `$JAXCHAT_CACHE/xgrammar/tokenizer-info-
    <key>.json`, the key hashing the tokenizer's whole serialization (`backend_tokenizer.to_str()`), its class
    and settings, the vocab size, the stop ids and xgrammar's version; a later start deserializes it (0.06 s).
    A tokenizer without a Rust backend, JAXCHAT_TOKENIZER_CACHE=0, or a file that cannot be read or written:
    computed each time."""
    import os

    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or os.environ.get("JAXCHAT_TOKENIZER_CACHE", "1") == "0":
        return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids)
    import xxhash

    from jaxchat.assets import atomic_write, cache_dir

    key = xxhash.xxh3_64()
    for part in (backend.to_str(), type(tokenizer).__name__, json.dumps(tokenizer.init_kwargs, sort_keys=True,
                 default=str), str(vocab_size), json.dumps(stop_ids), _xgrammar_version()):
        key.update(part.encode())
        key.update(b"\0")
    path = cache_dir() / "xgrammar" / f"tokenizer-info-{key.hexdigest()}.json"
    try:
        return xgr.TokenizerInfo.deserialize_json(path.read_text())
    except Exception:  # noqa: BLE001 - absent, unreadable or from another xgrammar: computed (and written) again
        pass
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids)
    try:
        with atomic_write(path, "w") as out:
            out.write(info.serialize_json())
    except OSError:
        pass  # a read-only cache only costs speed
    return info


class GrammarEngine:
    def __init__(self, tokenizer, vocab_size: int | None = None, stop_token_ids=None, max_threads: int = 2,
                 cache_size: int = 256, compile_timeout_s: float = 30.0):
        t0 = time.perf_counter()
        info, stops, kept = tokenizer_info(tokenizer, vocab_size, stop_token_ids)
        self.vocab_size = info.vocab_size
        self.tokenizer_info = info
        self.stop_token_ids = tuple(stops)
        self.xgr_stop_token_ids = tuple(kept)
        self.compiler = xgr.GrammarCompiler(info, max_threads=max_threads)
        self._cache: OrderedDict[str, object] = OrderedDict()  # bounded: clients may send ever-new schemas
        self.cache_size = cache_size
        self.compile_timeout_s = compile_timeout_s
        self._timed_out: OrderedDict[str, None] = OrderedDict()  # tags past the limit: refused at once
        self._empty: OrderedDict[str, bool] = OrderedDict()  # tag -> whether its grammar matches no text
        self._pending: dict[str, Future] = {}  # tag -> its compile under way (one thread per tag)
        self._lock = threading.Lock()  # the caches above: compiles finish on their own threads
        # the vocabulary by text (each chat format's markers are looked up in it): 0.3 s for 150k tokens, on a
        # thread of its own, neither on a start's path (the server opens meanwhile) nor on the first request's
        self._token_ids: Future = Future()
        threading.Thread(target=self._map_vocabulary, args=(info,), name="jaxchat-vocab", daemon=True).start()
        self.ready_ms = (time.perf_counter() - t0) * 1e3
        log.info("Grammar engine ready in %d ms", round(self.ready_ms))

    # -- vocabulary -------------------------------------------------------------------------------

    def _map_vocabulary(self, info: xgr.TokenizerInfo) -> None:
        try:
            ids: dict[bytes, int] = {}
            for i, b in enumerate(info.decoded_vocab):
                ids.setdefault(bytes(b), i)
        except BaseException as exc:  # noqa: BLE001 - raised again where the map is read
            self._token_ids.set_exception(exc)
            return
        self._token_ids.set_result(ids)

    def token_id(self, text: str) -> int | None:
        """The id of the token whose text is exactly `text`, or None when `text` is not one token."""
        return self._token_ids.result().get(text.encode()) if text else None

    # -- grammars ---------------------------------------------------------------------------------

    def compile(self, tag: dict):
        """The compiled grammar of a structural tag (cached by its JSON); waits for it on this thread."""
        key = json.dumps(tag, ensure_ascii=False)
        compiled = self._cached(key)
        if compiled is not None:
            return compiled
        try:
            return self._start(key).result(timeout=self.compile_timeout_s)
        except TimeoutError:
            raise self._timed_out_error(key) from None

    async def compile_async(self, tag: dict):
        """`compile` without blocking the event loop: the compile runs on its own thread (shared with any other
        request for the same tag) and is awaited for at most `compile_timeout_s`."""
        key = json.dumps(tag, ensure_ascii=False)
        compiled = self._cached(key)
        if compiled is not None:
            return compiled
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self._start(key)), self.compile_timeout_s)
        except TimeoutError:
            raise self._timed_out_error(key) from None

    def _cached(self, key: str):
        """The cached compiled grammar of `key`, or None; its cached failure or time-out raised again."""
        with self._lock:
            if key in self._timed_out:
                raise GrammarTimeout(f"grammar compilation took longer than the time limit of {self.compile_timeout_s:g} s")
            compiled = self._cache.get(key)
            if compiled is not None:
                self._cache.move_to_end(key)
        if isinstance(compiled, GrammarError):
            raise GrammarError(str(compiled))
        return compiled

    def _start(self, key: str) -> Future:
        """The compile of `key` under way, started on a daemon thread unless one runs already."""
        with self._lock:
            future = self._pending.get(key)
            if future is None:
                future = self._pending[key] = Future()
                future.set_running_or_notify_cancel()  # a waiter that gives up cannot cancel it for the others
                threading.Thread(target=self._run, args=(key, future), name="grammar-compile", daemon=True).start()
        return future

    def _run(self, key: str, future: Future) -> None:
        try:
            result = self.compiler.compile_structural_tag(key)
        except (RuntimeError, ValueError) as exc:  # xgrammar's own errors: cached like grammars (by content)
            result = GrammarError(compiler_message(exc))
        except BaseException as exc:  # noqa: BLE001 - handed to the waiters, not cached
            with self._lock:
                self._pending.pop(key, None)
            future.set_exception(exc)
            return
        with self._lock:
            self._pending.pop(key, None)
            if key not in self._timed_out:
                self._cache[key] = result
                while len(self._cache) > self.cache_size:  # least recently used first
                    del self._cache[next(iter(self._cache))]
        if isinstance(result, GrammarError):
            future.set_exception(result)
        else:
            future.set_result(result)

    def _timed_out_error(self, key: str) -> GrammarTimeout:
        """Remember `key` as past the limit (refused at once from now on) and return the error to raise."""
        with self._lock:
            self._timed_out[key] = None
            while len(self._timed_out) > self.cache_size:
                del self._timed_out[next(iter(self._timed_out))]
        return GrammarTimeout(f"grammar compilation took longer than the time limit of {self.compile_timeout_s:g} s")

    def matches_nothing(self, tag: dict) -> bool:
        """Whether the (compiled, cached) grammar of `tag` admits no text at all: neither its first token mask
        nor its end allows anything, or its root has no finite derivation (`emptiness`). Cached with it."""
        key = json.dumps(tag, ensure_ascii=False)
        with self._lock:
            verdict = self._empty.get(key)
        if verdict is not None:
            return verdict
        compiled = self.compile(tag)
        matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        mask = xgr.allocate_token_bitmask(1, self.vocab_size)
        matcher.fill_next_token_bitmask(mask)
        verdict = (not matcher.is_terminated() and not mask.any()) or matches_nothing(compiled.grammar)
        with self._lock:
            self._empty[key] = verdict
            while len(self._empty) > self.cache_size:
                del self._empty[next(iter(self._empty))]
        return verdict

    def request_tags(self, spec: ChatFormatSpec, request: ConstraintRequest, tools_enabled: bool = True) -> list[dict]:
        """Every structural tag that checking and constraining `request` compiles: its output field's, its custom
        tools' arguments, its chat tag (and the one that allows reasoning). Raises what `chat_structural_tag` raises."""
        tags = []
        fmt = output_format(request.output) if request.output is not None else None
        if fmt is not None:
            tags.append({"type": "structural_tag", "format": fmt})
        if tools_enabled:
            tags += [{"type": "structural_tag", "format": g} for t in request.tools
                     if (g := custom_arguments(t)) is not None]
        tag = chat_structural_tag(spec, request, tools_enabled)
        if tag is not None:
            tags.append(tag)
            if spec.reasoning and spec.reasoning_start and not request.allow_reasoning:
                with_reasoning = chat_structural_tag(spec, replace(request, allow_reasoning=True), tools_enabled)
                if with_reasoning is not None:
                    tags.append(with_reasoning)
        return list({json.dumps(t, ensure_ascii=False): t for t in tags}.values())

    def check_output(self, output: OutputConstraint) -> None:
        """A 400 naming `output.param` unless its regex / choice / grammar compiles and admits some text."""
        fmt = output_format(output)
        if fmt is None:
            return
        tag = {"type": "structural_tag", "format": fmt}
        try:
            empty = self.matches_nothing(tag)
        except GrammarTimeout as exc:
            raise RequestError(output.param, f"the {output.kind} cannot be used: {exc}") from None
        except (RuntimeError, ValueError) as exc:
            raise RequestError(output.param, f"the {output.kind} does not compile: {exc}") from None
        if empty:
            raise RequestError(output.param, f"the {output.kind} matches no text at all")

    def check_custom_tools(self, tools) -> None:
        """A 400 naming the definition of the first custom tool whose grammar cannot be converted or compiled."""
        check_custom_tools(tools)
        for i, tool in enumerate(tools):
            grammar = custom_arguments(tool)
            if grammar is not None:
                param = f"tools[{i}].custom.format.grammar.definition"
                try:
                    empty = self.matches_nothing({"type": "structural_tag", "format": grammar})
                except RuntimeError as exc:
                    raise RequestError(param, f"the grammar cannot be used: {exc}") from None
                if empty:
                    raise RequestError(param, f"the {custom_format(tool)[0]} grammar matches no text at all")

    def _stops_for(self, spec: ChatFormatSpec) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(xgrammar stop ids for this format, stop ids the grammar matches as text)."""
        ids = {m: self.token_id(m) for m in text_markers(spec)}
        as_text = tuple(i for i in ids.values() if i is not None)
        return tuple(s for s in self.xgr_stop_token_ids if s not in as_text), as_text

    def grammar_constraint(self, spec: ChatFormatSpec, request: ConstraintRequest, tag: dict,
                           tools_enabled: bool = True) -> GrammarConstraint:
        reasoning = None
        if spec.reasoning and spec.reasoning_start and not request.allow_reasoning:
            with_reasoning = chat_structural_tag(spec, replace(request, allow_reasoning=True), tools_enabled)
            reasoning = self.compile(with_reasoning) if with_reasoning is not None else None
        stops, as_text = self._stops_for(spec)
        guards = {m: self.token_id(m) for m in guarded_markers(spec)}
        late = guards.pop(spec.reasoning_start, None) if spec.reasoning_start else None
        return GrammarConstraint(
            self.compile(tag),
            vocab_size=self.vocab_size,
            role="assistant" if spec.kind == "harmony" else "",
            reasoning_start=spec.reasoning_start,
            reasoning_compiled=reasoning,
            text_stop_ids=as_text,
            stop_token_ids=stops or None,
            guard_ids=tuple(i for i in guards.values() if i is not None and i not in as_text
                            and i not in self.xgr_stop_token_ids),
            late_guard_ids=() if late is None else (late,),
            canary_id=self.token_id("a"),
            opener_ids=tuple(i for i in (self.token_id(spec.tool_start),) if i is not None),
            end_ids=stops or self.xgr_stop_token_ids,
        )

    def make(self, spec: ChatFormatSpec, request: ConstraintRequest, prefill: str = "",
             tools_enabled: bool = True) -> GrammarConstraint | TokenBanConstraint | None:
        """The constraint of a request, started with `prefill`; None when nothing is constrained."""
        constraint = chat_make_constraint(self, spec, request, tools_enabled)
        if constraint is not None:
            constraint.start(prefill)
        return constraint

    def accepts(self, spec: ChatFormatSpec, request: ConstraintRequest, prefill: str, text: str,
                tools_enabled: bool = True) -> tuple[bool, int]:
        """Feed `text` through the request's grammar; (ok, byte offset in `text` where it failed)."""
        data = text.encode()
        tag = chat_structural_tag(spec, request, tools_enabled)
        if tag is None:
            return True, len(data)
        constraint = self.grammar_constraint(spec, request, tag, tools_enabled)
        constraint.start(prefill)
        if constraint.disabled:
            return False, 0
        matcher = constraint.matcher
        for i in range(len(data)):
            if not matcher.accept_string(data[i:i + 1]):
                return False, i
        return matcher.is_completed(), len(data)


def chat_make_constraint(engine: GrammarEngine, spec: ChatFormatSpec, request: ConstraintRequest,
                         tools_enabled: bool = True):
    """A grammar constraint when the request needs one; a token ban for tool_choice "none" when the
    tool opener is a single token; else None (the decode loop pays nothing). Not yet started."""
    tag = chat_structural_tag(spec, request, tools_enabled)
    if tag is not None:
        return engine.grammar_constraint(spec, request, tag, tools_enabled)
    if request.tool_choice == "none" and request.tools and spec.tool_start:
        opener = engine.token_id(spec.tool_start)
        if opener is not None:
            return token_ban_constraint(engine.vocab_size, opener)
    return None
