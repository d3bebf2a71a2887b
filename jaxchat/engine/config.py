"""One engine configuration: every setting an engine takes, each default declared here and nowhere else (no JAX).

Contract:
- `EngineConfig` (frozen): the settings of `engine.Engine`, `Engine.from_path`, `engine.replicas.from_path`,
  `api.build_chat_service`, `jaxchat.LLM` and `jaxchat serve` (which builds it from its flags,
  `cli.engine_config`). Its field defaults are what a user gets unless told otherwise, the same at every entry
  point: `MAX_BATCH` rows (slots) of at most `MAX_CONTEXT` tokens, speculation "auto", the program set of
  `program_set.default_program_set()` (`JAXCHAT_PROGRAMS`, else "background"). Fields left None are "the
  platform's default". A value out of range or not among the choices is a ValueError naming the field.
- `replace(**changes)`: a copy with those fields changed (an unknown name is a TypeError naming it).
- `resolve(platform)`: the same settings with every platform default filled in (`platform` as
  `jax.Device.platform` says it: "cpu", "gpu", "tpu"): speculation "auto" → ngram on CPU, off elsewhere
  (`default_speculative`); `draft_tokens` → `DRAFT_TOKENS` with ngram, else 0; `page_size` → 16 on CPU and GPU,
  the Pallas kernel's guidance on TPU; `max_step_tokens` → 512 on CPU, 2048 elsewhere, never more than
  `max_batch` × `max_context`; `programs` → the environment's default (in a cluster of several processes too: process
  0 takes up a background program once every process has it, `Engine.compile_rest`). Resolving a resolved config
  changes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jaxchat.engine.program_set import check_program_set, default_program_set

MAX_BATCH = 8  # requests that run at once (slots)
MAX_CONTEXT = 4096  # tokens a request may hold (prompt + output): a limit, not a reservation
BURST_GAP_S = 0.003  # an idle engine woken by a request waits while more arrive, each within this gap,
BURST_WINDOW_S = 0.03  # for at most this long in all
DRAFT_TOKENS = 7  # the most tokens a row drafts per step (`drafts.DraftLength` adapts it per row)
ATTENTION_CHOICES = ("auto", "xla", "pallas")
SPECULATIVE_CHOICES = ("auto", "off", "ngram")


def default_speculative(platform: str) -> str:
    """What `speculative="auto"` runs: ngram on CPU, where bench/speculative.py shows it pays at batch 1 and costs
    nothing at 16 (docs/benchmarks.md); off on accelerators until a device run there shows the same."""
    return "ngram" if platform == "cpu" else "off"


def default_page_size(platform: str, max_context: int = MAX_CONTEXT) -> int:
    """16 tokens on CPU and GPU; on TPU the Pallas kernel's guidance for `max_context` (128 to 256 tokens,
    `attention_tpu.page_size_for`)."""
    if platform != "tpu":
        return 16
    from jaxchat.engine.attention_tpu import page_size_for

    return page_size_for(max_context)


def default_step_tokens(platform: str) -> int:
    """The most tokens one step runs: on CPU a step's matmuls cost with its tokens, so a long prompt is cut in
    chunks of 512 (a decode step beside one waits for it); accelerators take 2048."""
    return 512 if platform == "cpu" else 2048


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    max_batch: int = MAX_BATCH
    max_context: int = MAX_CONTEXT
    dtype: str = "auto"  # the weights' dtype when loading (`models.load.DTYPES`)
    quantize: str | None = None  # "int8": int8 weights (`models.load.load_model`)
    page_size: int | None = None
    kv_cache_gib: float | None = None  # the KV pool's GiB per device (None: planned from the device's memory)
    num_pages: int | None = None  # exactly this many pages (tests, benchmarks)
    max_step_tokens: int | None = None
    step_token_buckets: tuple[int, ...] | None = None  # exactly these ragged token counts
    decode_rows: tuple[int, ...] | None = None  # the decode steps' row counts (default: powers of 2 to max_batch)
    prefix_cache: bool = True
    jump_forward: bool = True
    overlap: bool = True
    attention: str = "auto"
    speculative: str = "auto"
    draft_tokens: int | None = None
    programs: str | None = None
    executable_cache: str | None = None  # a directory of serialized step programs (`executables`)
    burst_gap_s: float = BURST_GAP_S
    burst_window_s: float = BURST_WINDOW_S

    def __post_init__(self) -> None:
        values = {f.name: self.__dict__[f.name] for f in dataclasses.fields(self)}
        for name in ("max_batch", "max_context", "page_size", "num_pages", "max_step_tokens"):
            if values[name] is not None and int(values[name]) < 1:
                raise ValueError(f"{name} {values[name]}: must be at least 1")
        if self.draft_tokens is not None and self.draft_tokens < 0:
            raise ValueError(f"draft_tokens {self.draft_tokens}: must not be negative")
        if self.speculative not in SPECULATIVE_CHOICES:
            raise ValueError(f"speculative {self.speculative!r}: choose one of {', '.join(SPECULATIVE_CHOICES)}")
        if self.attention not in ATTENTION_CHOICES:
            raise ValueError(f"attention {self.attention!r}: choose one of {', '.join(ATTENTION_CHOICES)}")
        if self.programs is not None:
            check_program_set(self.programs)
        for name in ("step_token_buckets", "decode_rows"):
            if values[name] is not None:
                object.__setattr__(self, name, _counts(name, values[name]))
        if self.decode_rows is not None and not all(1 <= r <= self.max_batch for r in self.decode_rows):
            raise ValueError(f"decode_rows {self.decode_rows}: each row count must be from 1 to max_batch "
                             f"({self.max_batch})")
        if self.executable_cache is not None:
            object.__setattr__(self, "executable_cache", str(self.executable_cache))

    def replace(self, **changes) -> EngineConfig:
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(f"unknown engine setting{'s' * (len(unknown) > 1)}: {', '.join(unknown)}")
        return dataclasses.replace(self, **changes) if changes else self

    def resolve(self, platform: str) -> EngineConfig:
        speculative = default_speculative(platform) if self.speculative == "auto" else self.speculative
        programs = self.programs or default_program_set()
        step_tokens = min(self.max_step_tokens or default_step_tokens(platform), self.max_batch * self.max_context)
        return dataclasses.replace(
            self, speculative=speculative, programs=programs, max_step_tokens=step_tokens,
            draft_tokens=(self.draft_tokens or DRAFT_TOKENS) if speculative == "ngram" else 0,
            page_size=self.page_size or default_page_size(platform, self.max_context))


def _counts(name: str, value: Sequence[int]) -> tuple[int, ...]:
    counts = tuple(int(v) for v in value)
    if not counts or min(counts) < 1:
        raise ValueError(f"{name} {counts}: give at least one count, each at least 1")
    return counts

