"""One request's state on the engine thread, from submission to its last delta.

Contract: a `Sequence` holds what the scheduler and the token handler share about a request: the request,
its callback, its stop ids, detokeniser and stop matcher; its slot (-1: none) and pages; how many of its
tokens (prompt, then outputs) have K/V in those pages (`computed`), the tokens its next step runs
(`pending`: the prompt's rest, or the last sampled token and the forced text after it), the grammar mask
of its next sampled token, its sampling values, and its counters. Its full token sequence is
`prompt + out_ids`; `position` is the position of its newest token. In the overlapped loop a sampled token
may still be on the device (`inflight`), and may already run in the next step (`fed`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from jaxchat.engine.plan import SamplingRow
from jaxchat.engine.tokenizer import IncrementalDetokenizer, StopStringMatcher
from jaxchat.engine.types import GenerationOutput, GenerationRequest


@dataclasses.dataclass(eq=False)
class Sequence:
    req: GenerationRequest
    emit: Callable[[GenerationOutput], None]
    stop_ids: frozenset[int]
    arrival: int  # submission order: the newest request is preempted first
    mask: np.ndarray  # int32[W], the bitmask of the next sampled token
    detok: IncrementalDetokenizer | None = None
    stops: StopStringMatcher | None = None
    sampling: SamplingRow | None = None  # its sampling values (`plan.sampling_values`), set at its first admission
    slot: int = -1
    pages: list[int] = dataclasses.field(default_factory=list)
    keyed: tuple[int, bytes] | None = None  # the prefix cache's chain over its full pages (`PagePool.register`)
    computed: int = 0  # tokens whose K/V its pages hold (positions 0 .. computed - 1)
    pending: list[int] = dataclasses.field(default_factory=list)  # tokens its next step runs, from `computed` on
    count_from: int = 0  # pending tokens at positions >= count_from are outputs not yet counted
    fresh: bool = True  # its next step is its first in its slot: counts and prompt mask restart
    cached: int = 0  # prompt tokens reused from the prefix cache
    generated: int = 0
    finished: bool = False
    started: bool = False  # admitted once (its detokeniser and stop matcher exist)
    preempted: int = 0  # times its pages were taken back
    out_ids: list[int] = dataclasses.field(default_factory=list)
    planned: list[int] = dataclasses.field(default_factory=list)  # forced tokens to take one per step (no jumping)
    inflight: bool = False  # a token sampled for it is on the device, not taken yet
    fed: bool = False  # that token already runs in a launched step (fed from the device), so it is not pending
    epoch: int = 0  # bumped by a preemption: a step planned before it no longer speaks for this request
    drafts: tuple | None = None  # (drafts.NgramIndex, drafts.DraftLength) of a request that drafts (`speculate`)
    draft_masks: np.ndarray | None = None  # int32[k + 1, W]: the masks at its drafted positions this step

    @property
    def prompt(self) -> list[int]:
        return self.req.prompt_ids

    @property
    def tokens(self) -> list[int]:
        return list(self.req.prompt_ids) + self.out_ids

    @property
    def position(self) -> int:
        """The position of its newest token (the one its next step writes last)."""
        return len(self.req.prompt_ids) + len(self.out_ids) - 1
