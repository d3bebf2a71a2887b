"""What passes between the scheduler, which decides, and the engine core, which executes (no JAX here).

Contract:
- `RowInput`: one row of a step as the runner (`step.StepRunner`) takes it: its slot, the tokens it runs from
  position `start` on, its page table, and what its sampler needs.
- `StepPlan` (`Scheduler.schedule`): the rows of one step, each a `PlannedRow` (the request, its `RowInput`, the
  request's epoch when planned); `key` is the forward program that ran it (set by the core at launch).
- `StepLimits`: what the programs compiled so far can run in one step (the runner's `max_step_tokens`,
  `max_step_rows`, `max_verify_tokens`; they grow while programs compile in the background). `SchedulerShape`:
  what does not change (slots, context, pool, mask width, the largest verify step once every program is ready).
- `StepResult` (`Scheduler.update`): a step's sampled outputs on the host (`sampler.SampleOut`'s fields: tokens,
  logprob, top_ids, top_logprobs, one per sampled position) and `positions`: which of them belong to each row
  of its plan (`positions_of`).
- `SamplingRow`: one row's sampling values by name (`RowInput.sampling`); `sampling_values(request)` a request's;
  `NEUTRAL_SAMPLING` those of a row that never samples.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from jaxchat.engine.program_key import ProgramKey


class SamplingRow(NamedTuple):
    """One row's sampling values, in `sampler.SamplingArrays` field order (the sampler's arrays are these, one
    per row)."""

    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0
    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0  # 1: off
    seed: int = 0
    step: int = 0  # the tokens the row generated so far: where its seeded draws are
    logprobs: bool = False


NEUTRAL_SAMPLING = SamplingRow()  # a row with no sampling values (it never samples)


class RowInput(NamedTuple):
    """One row of a step (see `step`'s module docstring)."""

    slot: int
    tokens: Sequence[int]
    start: int  # the position of tokens[0]
    pages: Sequence[int]  # the row's page table, covering positions < start + len(tokens)
    fresh: bool  # the row's counts and prompt mask restart (its first tokens in this slot)
    prompt_len: int  # tokens at positions < prompt_len are prompt tokens (the prompt mask)
    count_from: int  # tokens at positions >= count_from are outputs (counted for the penalties)
    samples: bool  # the token sampled after its last token is the row's next one (counted)
    mask: np.ndarray | None  # int32[W], the bitmask of its next token (None: every token allowed)
    sampling: SamplingRow
    feed: bool = False  # tokens[0] is the token last sampled in its slot (still on the device); its value ignored
    drafts: int = 0  # its last `drafts` tokens are drafts: it samples at every token (mask [drafts + 1, W])
    bias: tuple = ()  # its logit bias, (token id, value) pairs (`SamplingParams.logit_bias`)


class PlannedRow(NamedTuple):
    seq: Any  # the request's `sequence.Sequence`
    input: RowInput
    epoch: int = 0  # the request's epoch when planned (a preemption since makes the row stale)


class StepPlan(NamedTuple):
    """What one step runs: its rows in order (each a request and its `RowInput`)."""

    rows: list[PlannedRow]
    key: ProgramKey | None = None  # the forward program it ran (set at launch)

    @property
    def tokens(self) -> int:
        return sum(len(row.input.tokens) for row in self.rows)

    @property
    def inputs(self) -> list[RowInput]:
        return [row.input for row in self.rows]

    @property
    def samples(self) -> bool:
        """Whether any row samples (the core fetches the step's tokens only then)."""
        return any(row.input.samples for row in self.rows)

    @property
    def logprobs(self) -> bool:
        """Whether a sampling row asks for logprobs (the core fetches them only then)."""
        return any(row.input.samples and row.seq.req.sampling.logprobs is not None for row in self.rows)


class StepLimits(NamedTuple):
    """What one step may run now, given the programs compiled so far (`step.StepRunner`'s properties)."""

    max_step_tokens: int
    max_step_rows: int
    max_verify_tokens: int = 0  # 0: no verify program (yet)


class SchedulerShape(NamedTuple):
    """The fixed geometry the scheduler plans within (read once from the runner)."""

    max_batch: int  # slots
    max_context: int
    num_pages: int  # the pool's pages, page 0 included (never handed out)
    page_size: int
    mask_words: int
    prefix_reuse: bool = True  # False: a model with recurrent layers (uniform steps, no page sharing)
    max_verify_tokens: int = 0  # the largest verify step once every program is ready (0: no speculation)

    @classmethod
    def of(cls, runner: Any) -> SchedulerShape:
        return cls(runner.max_batch, runner.max_context, runner.num_pages, runner.page_size, runner.mask_words,
                   runner.prefix_reuse, max((k.tokens for k in runner.program_keys() if k.kind == "verify"), default=0))


class StepResult(NamedTuple):
    """A step's sampled outputs on the host and the positions of each row among them."""

    out: Any  # `sampler.SampleOut` of host arrays
    positions: list[range]


def positions_of(key: ProgramKey | None, rows: Sequence[RowInput]) -> list[range]:
    """Which sampled positions belong to each row: its own index, or, in a verify step, one per token."""
    if key is None or key.kind != "verify":
        return [range(i, i + 1) for i in range(len(rows))]
    out, at = [], 0
    for row in rows:
        out.append(range(at, at + len(row.tokens)))
        at += len(row.tokens)
    return out


def sampling_values(req: Any) -> SamplingRow:
    """A request's (`types.GenerationRequest`) sampling values, `step` 0 (the scheduler sets it per step to the
    request's generated count); a request without a seed gets a random one."""
    s = req.sampling
    seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(4), "little")
    return SamplingRow(max(s.temperature, 0.0), s.top_p, s.top_k, s.min_p, s.presence_penalty, s.frequency_penalty,
                       s.repetition_penalty, seed & 0xFFFFFFFF, 0, s.logprobs is not None)
