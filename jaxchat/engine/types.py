"""The engine's public types: what a caller submits and what it gets back.

Contract: callers (the OpenAI layer `jaxchat.api`, benchmarks, tests) talk to the engine only through
these types (`EngineStats`: what it reports) and the `Constraint` protocol: token ids, sampling parameters, stop conditions and a
constraint object. The engine never imports `jaxchat.chat`, `jaxchat.api` or the server.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class Constraint(Protocol):
    """A per-request decoding constraint (built by `jaxchat.constrain`), driven by the engine's host loop.

    Bitmask layout (`jaxchat.bitmask`): int32 words, bit j of word i is token 32*i + j, 1 = allowed.
    Optional capabilities are declared by attributes, which the engine reads (it never probes for methods):
    `jumps` (jump-forward: `forced_text`, `accept_jumped`), `drafts` (speculative decoding keeps the grammar:
    `draft_masks`), `batch_fill` (None, or a callable filling the masks of several constraints of this type in one
    call: `batch_fill(constraints, rows)`). `ConstraintBase` declares none of them.
    """

    jumps: bool
    drafts: bool
    batch_fill: Callable[[list, list], None] | None

    def fill_mask(self, row: np.ndarray) -> None:
        """Write the allowed-token bitmask for the next token into `row` (int32[`jaxchat.bitmask.mask_words(V)`])."""

    def accept(self, token: int) -> bool:
        """Advance by the sampled token; False when the grammar rejected it (the constraint then gives up)."""

    def is_terminated(self) -> bool:
        """True when the grammar has reached an accepting end and nothing more may follow."""

    def forced_text(self) -> str:
        """(`jumps`) The text the grammar admits as the only continuation from here ("" when there is a choice)."""

    def accept_jumped(self, token: int) -> bool:
        """(`jumps`) Advance by a token of `forced_text()`'s tokenisation; False (state unchanged) when the grammar
        does not take it, so the jump stops before it."""

    def draft_masks(self, drafts: list[int], masks: np.ndarray) -> int:
        """(`drafts`) The masks of the next token and after each draft token (`masks[j]`); returns how many drafts
        the grammar admits in a row. The constraint's state is as before the call."""


class ConstraintBase:
    """A constraint with no optional capability (`Constraint`): subclasses implement `fill_mask`, `accept` and
    `is_terminated`, and declare (and implement) what more they offer."""

    jumps = False
    drafts = False
    batch_fill: Callable[[list, list], None] | None = None

    def forced_text(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} declares no jump-forward (jumps = False)")

    def accept_jumped(self, token: int) -> bool:
        raise NotImplementedError(f"{type(self).__name__} declares no jump-forward (jumps = False)")

    def draft_masks(self, drafts: list[int], masks: np.ndarray) -> int:
        raise NotImplementedError(f"{type(self).__name__} declares no draft masks (drafts = False)")


LOGIT_BIAS_SLOTS = 32  # logit_bias entries a request may carry (the sampler's static width: no new program shapes)


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings, matched on the detokenised text, not included in the output
    stop_token_ids: tuple[int, ...] = ()  # extra stop tokens on top of the model's eos ids
    ignore_eos: bool = False
    logprobs: int | None = None  # None = off; k >= 0 = the chosen token's logprob plus the top k
    # (token id, value) pairs added to the row's logits before sampling (-inf bans); at most
    # `LOGIT_BIAS_SLOTS` of them; text the grammar forces (jump-forward) is not sampled
    logit_bias: tuple[tuple[int, float], ...] = ()


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    constraint: Constraint | None = None
    request_id: str = ""


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class GenerationOutput:
    """One step's worth of output for one request (deltas, not totals)."""

    request_id: str
    token_ids: list[int]
    text: str  # newly decoded text: complete UTF-8 only, special tokens included as text
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: str | int | None = None  # the stop string or token id that ended it
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens whose K/V were reused from an earlier request (prefix reuse)


@dataclass(frozen=True)
class EngineStats:
    """What an engine (or a front of data-parallel replicas: sums, but `max_context` and `kv_page_size`) reports
    for `/metrics` and `/health`. The compile counts are the engine's own (its warm-up, background and steps), not
    the process's; `compiles_on_request_path` counts what the steps themselves compiled (0 once warm)."""

    running: int = 0
    waiting: int = 0
    free_slots: int = 0
    max_batch: int = 0
    max_context: int = 0
    steps: int = 0
    generated_tokens: int = 0
    prefix_cache_hit_tokens: int = 0
    jump_forward_tokens: int = 0
    preemptions: int = 0
    draft_tokens: int = 0
    draft_accepted_tokens: int = 0
    kv_pages_used: int = 0
    kv_pages_total: int = 0
    kv_page_size: int = 0
    compile_count: int = 0
    compiles_on_request_path: int = 0
    programs_ready: int = 0
    programs_total: int = 0
    compile_cache_hits: int = 0
    programs_loaded: int = 0
    replicas: int = 1
