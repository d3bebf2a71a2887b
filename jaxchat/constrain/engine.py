"""The grammar engine: one per model. xgrammar tokenizer info, compiler, compiled-grammar cache.

Contract:
- `GrammarEngine(tokenizer, vocab_size=None, stop_token_ids=None)` reads the vocabulary of a
  transformers tokenizer (or of a tiktoken-style encoding with `decode_single_token_bytes`), pads
  it to `vocab_size` (the model's logits size), and logs `Grammar engine ready in N ms`. Stop tokens
  that some format's grammar matches as text (`<|call|>`, `<|return|>`, `<|end|>`) are kept out of
  xgrammar's stop list.
- `compile(tag)` compiles a structural tag once; later calls with the same tag JSON are a dict hit (an LRU of
  `cache_size`). A compile that takes longer than `compile_timeout_s` raises `GrammarTimeout` (a RuntimeError)
  and is left to finish on its daemon thread; the same tag is then refused at once (no second thread).
  xgrammar's own errors come out as `GrammarError` (a RuntimeError) carrying its message without its log prefix.
- `check_output(output)` compiles an `OutputConstraint`'s regex / choice / grammar alone and raises
  `RequestError(output.param, compiler message)` when xgrammar cannot compile it, it times out, or it admits
  no text at all.
- `make(spec, request, prefill)` returns the request's constraint (`GrammarConstraint`,
  `TokenBanConstraint` or None, see `chat_make_constraint`), already started with the prefill.
- `accepts(spec, request, prefill, text)` feeds a whole output through the grammar byte by byte and
  returns `(True, len(text_bytes))`, or `(False, byte_offset_in_text)` where it fails (the length
  when the text is a valid but unfinished prefix).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import replace

import xgrammar as xgr

from jaxchat.chat import ChatFormatSpec, ConstraintRequest, RequestError
from jaxchat.chat.structured import OutputConstraint
from jaxchat.constrain.constraint import GrammarConstraint, TokenBanConstraint, token_ban_constraint
from jaxchat.constrain.custom_tools import check_custom_tools, custom_arguments
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


def _compile_bounded(compile_fn, key: str, timeout_s: float):
    """`compile_fn(key)` on a daemon thread, waited for at most `timeout_s` (GrammarTimeout past it)."""
    box: list = []
    done = threading.Event()

    def run():
        try:
            box.append((True, compile_fn(key)))
        except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
            box.append((False, exc))
        done.set()

    threading.Thread(target=run, name="grammar-compile", daemon=True).start()
    if not done.wait(timeout_s):
        raise GrammarTimeout(f"grammar compilation took longer than the time limit of {timeout_s:g} s")
    ok, value = box[0]
    if not ok:
        raise value
    return value


class GrammarEngine:
    def __init__(self, tokenizer, vocab_size: int | None = None, stop_token_ids=None, max_threads: int = 2,
                 cache_size: int = 256, compile_timeout_s: float = 30.0):
        t0 = time.perf_counter()
        kind, default_stops, n_tok = _vocab_and_eos(tokenizer)
        self.vocab_size = int(vocab_size or n_tok)
        if kind == "bytes":
            vocab = []
            for i in range(n_tok):
                try:
                    vocab.append(tokenizer.decode_single_token_bytes(i))
                except (KeyError, ValueError, RuntimeError):  # holes in the id space decode to nothing
                    vocab.append(b"")
            self._decoded = vocab
        stops = [int(s) for s in (stop_token_ids if stop_token_ids is not None else default_stops)]
        text_of = self._text_of_factory(tokenizer, kind)
        kept = [s for s in stops if text_of(s) not in _ALL_TEXT_MARKERS] or stops[:1]
        if kind == "hf":
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size, stop_token_ids=kept)
        else:
            info = xgr.TokenizerInfo(self._decoded, xgr.VocabType.RAW, vocab_size=self.vocab_size,
                                     stop_token_ids=kept)
        self.tokenizer_info = info
        self.stop_token_ids = tuple(stops)
        self.xgr_stop_token_ids = tuple(kept)
        self.compiler = xgr.GrammarCompiler(info, max_threads=max_threads)
        self._cache: OrderedDict[str, object] = OrderedDict()  # bounded: clients may send ever-new schemas
        self.cache_size = cache_size
        self.compile_timeout_s = compile_timeout_s
        self._timed_out: OrderedDict[str, None] = OrderedDict()  # tags past the limit: refused at once
        self._token_ids: dict[bytes, int] | None = None
        self.ready_ms = (time.perf_counter() - t0) * 1e3
        log.info("Grammar engine ready in %d ms", round(self.ready_ms))

    def _text_of_factory(self, tokenizer, kind):
        if kind == "bytes":
            return lambda i: self._decoded[i].decode("utf-8", "replace") if 0 <= i < len(self._decoded) else ""
        return lambda i: tokenizer.convert_ids_to_tokens(i) or ""

    # -- vocabulary -------------------------------------------------------------------------------

    def token_id(self, text: str) -> int | None:
        """The id of the token whose text is exactly `text`, or None when `text` is not one token."""
        if self._token_ids is None:
            ids: dict[bytes, int] = {}
            for i, b in enumerate(self.tokenizer_info.decoded_vocab):
                ids.setdefault(bytes(b), i)
            self._token_ids = ids
        return self._token_ids.get(text.encode()) if text else None

    # -- grammars ---------------------------------------------------------------------------------

    def compile(self, tag: dict):
        """The compiled grammar of a structural tag (cached by its JSON)."""
        key = json.dumps(tag, ensure_ascii=False)
        compiled = self._cache.get(key)
        if compiled is None:
            if key in self._timed_out:
                raise GrammarTimeout(f"grammar compilation took longer than the time limit of {self.compile_timeout_s:g} s")
            try:
                compiled = _compile_bounded(self.compiler.compile_structural_tag, key, self.compile_timeout_s)
            except GrammarTimeout:
                self._timed_out[key] = None
                while len(self._timed_out) > self.cache_size:
                    del self._timed_out[next(iter(self._timed_out))]
                raise
            except RuntimeError as exc:
                raise GrammarError(compiler_message(exc)) from exc
            self._cache[key] = compiled
            while len(self._cache) > self.cache_size:  # least recently used first
                del self._cache[next(iter(self._cache))]
        else:
            self._cache.move_to_end(key)
        return compiled

    def check_output(self, output: OutputConstraint) -> None:
        """A 400 naming `output.param` unless its regex / choice / grammar compiles and admits some text."""
        fmt = output_format(output)
        if fmt is None:
            return
        try:
            compiled = self.compile({"type": "structural_tag", "format": fmt})
        except GrammarTimeout as exc:
            raise RequestError(output.param, f"the {output.kind} cannot be used: {exc}") from None
        except (RuntimeError, ValueError) as exc:
            raise RequestError(output.param, f"the {output.kind} does not compile: {exc}") from None
        matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
        mask = xgr.allocate_token_bitmask(1, self.vocab_size)
        matcher.fill_next_token_bitmask(mask)
        if not matcher.is_terminated() and not mask.any():
            raise RequestError(output.param, f"the {output.kind} matches no text at all")

    def check_custom_tools(self, tools) -> None:
        """A 400 naming the definition of the first custom tool whose grammar cannot be converted or compiled."""
        check_custom_tools(tools)
        for tool in tools:
            grammar = custom_arguments(tool)
            if grammar is not None:
                try:
                    self.compile({"type": "structural_tag", "format": grammar})
                except RuntimeError as exc:
                    i = tools.index(tool)
                    raise RequestError(f"tools[{i}].custom.format.grammar.definition",
                                       f"the grammar cannot be used: {exc}") from None

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
