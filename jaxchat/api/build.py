"""Build the serving pipeline for a model path: engine, grammar engine and `ChatService` in one call.

Contract: `build_chat_service(model=None, config=None, constrained=True, data_parallel=None, **settings)` loads
`model` (an HF directory, a GGUF file or an orbax checkpoint; None = the default model asset) as `config`
(`jaxchat.engine.config.EngineConfig`, default its defaults: those of `jaxchat serve` and `jaxchat.LLM`) with
`settings` (its fields: `max_batch`, `dtype`, `quantize` "int8" for int8 weights, ...; and `warmup`, `start`)
changed, starts an engine (`data_parallel` N > 1: N replicas, each over
1/N of the devices with `max_batch` rows, behind one front, `engine.replicas`; None: its default) and, unless `constrained` is False, a
grammar engine over the same tokenizer and vocabulary (xgrammar imported and the grammar engine built once the
first programs are lowered or loaded, while they compile or first run), and returns the `ChatService` serving it
under `model_id_for(model)`. jax and xgrammar are imported only when it is called, so the request readers and
shapes of `jaxchat.api` load without them.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from jaxchat.api.service import ChatService

__all__ = ["build_chat_service", "default_executable_cache", "model_id_for"]

_QUANT_SUFFIXES = (".gguf", "-q4_k_m", "-q4_1", "-Q4_K_M", ".Q4_1")


def model_id_for(path) -> str:
    """The name a model is served under: its file or directory name without quantisation suffixes."""
    name = Path(str(path)).name
    for suffix in _QUANT_SUFFIXES:
        name = name.removesuffix(suffix)
    return name


def default_executable_cache(compile_cache=None) -> Path:
    """The executable store of a compilation cache directory (default: the one `jaxchat serve` uses): the step
    programs serialized under its `executables/` folder. `jaxchat serve` and `jaxchat.LLM()` both keep their
    programs there, so a program compiled by one is loaded by the other."""
    from jaxchat.engine.compile_cache import default_compile_cache_dir

    return Path(compile_cache if compile_cache is not None else default_compile_cache_dir()) / "executables"


def default_programs() -> str:
    """Which step programs `jaxchat serve` and `jaxchat.LLM()` compile, and when, unless told: "background", or
    what the environment's `JAXCHAT_PROGRAMS` says (`jaxchat.engine.program_set`)."""
    from jaxchat.engine.program_set import default_program_set

    return default_program_set()


def build_chat_service(model=None, config=None, *, constrained: bool = True, data_parallel: int | None = None,
                       **settings) -> ChatService:
    from jaxchat.assets import DEFAULT_MODEL, asset_path
    from jaxchat.engine import replicas

    if model is None:
        model = asset_path(DEFAULT_MODEL)
    warmup, start = settings.pop("warmup", True), settings.pop("start", True)
    # xgrammar (and the torch it imports) loads, and the grammar engine reads the vocabulary, once the warm-up's
    # programs are lowered or loaded: what is left of the warm-up (XLA's compiles, the programs' first runs) leaves
    # the GIL free. Beside the weights' load or the programs' tracing, which hold the GIL too, the two slowed each
    # other: a cold start's build here was 1.2 s longer on average (three alternating pairs), a warm one no shorter.
    with ThreadPoolExecutor(1, thread_name_prefix="jaxchat-grammar") as pool:
        built: list = []
        lock = threading.Lock()

        def build_grammar() -> None:
            with lock:
                if constrained and not built:
                    built.append(pool.submit(_grammar_engine, engine.tokenizer, engine.model.config.vocab_size))

        engine = replicas.from_path(str(model), data_parallel, config, warmup=False, start=False, **settings)
        try:
            if warmup:
                engine.warm_up(lowered=build_grammar)
            build_grammar()  # without a warm-up (or one that lowered nothing)
            grammar = built[0].result() if built else None
            if start:
                engine.start()
        except BaseException:
            engine.shutdown()
            raise
    return ChatService(engine, model_id_for(model), grammar)


def _grammar_engine(tokenizer, vocab_size: int):
    try:
        from jaxchat.constrain import GrammarEngine
    except ImportError:  # raced another thread's import (transformers' lazy module is not thread-safe): once more
        from jaxchat.constrain import GrammarEngine
    return GrammarEngine(tokenizer, vocab_size=vocab_size)
