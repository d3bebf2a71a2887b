"""A runner with no device, for the scheduler's tests: it executes plans as a toy model would (no JAX).

Contract: `FakeRunner(max_batch, max_context, num_pages, page_size, max_step_tokens, ...)` has what
`core.EngineCore` calls (`launch`, `sample`, `fetch`, `release`, the step limits, `ragged_rows`) and runs a step
on the host: each row's tokens are written into its pages (`kv`: page -> the tokens at its positions), and the
token sampled after a position is `next_token` of every token the row's page table holds up to it (read back
through the pages). `alone(prompt, max_tokens)` is what one request gets with nothing beside it, so a planning
bug (a wrong or shared page, a token run twice or skipped, a chunk out of order) shows as tokens that differ
from it. Every launch is checked against the step limits (`steps` records each step's rows and tokens).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from jaxchat.engine.plan import RowInput, SchedulerShape
from jaxchat.engine.program_key import ProgramKey

VOCAB = 64


def next_token(context: list[int]) -> int:
    """The toy model: mostly copies the token 5 back (so prompt-lookup drafts are often right), and every token
    of the context can change it."""
    if len(context) < 5:
        return sum(context) % VOCAB
    return (context[-5] + (sum(context) % 7 == 0)) % VOCAB


def alone(prompt: list[int], max_tokens: int, eos: int | None = None) -> list[int]:
    out: list[int] = []
    while len(out) < max_tokens:
        out.append(next_token(prompt + out))
        if out[-1] == eos:
            break
    return out


class FakeOut(NamedTuple):
    tokens: np.ndarray
    logprob: np.ndarray
    top_ids: np.ndarray
    top_logprobs: np.ndarray


class FakeRunner:
    def __init__(self, max_batch: int, max_context: int, num_pages: int, page_size: int, max_step_tokens: int,
                 max_step_rows: int | None = None, max_verify_tokens: int = 0, prefix_reuse: bool = True) -> None:
        self.max_batch, self.max_context, self.num_pages, self.page_size = max_batch, max_context, num_pages, page_size
        self.max_step_tokens, self.max_verify_tokens = max_step_tokens, max_verify_tokens
        self.max_step_rows = max_step_rows or max_batch
        self.prefix_reuse = prefix_reuse
        self.ragged_rows = (1, max_batch)
        self.kv: dict[int, list[int | None]] = {}
        self.last: dict[int, int] = {}  # slot -> the token it sampled last (what a fed row runs)
        self.steps: list[tuple[int, int, bool]] = []  # (rows, tokens, verify) of each launch
        self._contexts: list[list[list[int]]] | None = None
        self._out: FakeOut | None = None
        self.released = False

    @property
    def shape(self) -> SchedulerShape:
        return SchedulerShape(self.max_batch, self.max_context, self.num_pages, self.page_size, 2,
                              self.prefix_reuse, self.max_verify_tokens)

    def launch(self, rows: list[RowInput]) -> tuple:
        verify = any(row.drafts for row in rows)
        tokens = sum(len(row.tokens) for row in rows)
        assert 0 < len(rows) <= self.max_step_rows, f"{len(rows)} rows over the limit of {self.max_step_rows}"
        assert tokens <= (self.max_verify_tokens if verify else self.max_step_tokens), f"{tokens} tokens over the limit"
        assert len({row.slot for row in rows}) == len(rows), "two rows of one step share a slot"
        self.steps.append((len(rows), tokens, verify))
        contexts = []
        for row in rows:
            run = list(row.tokens)
            if row.feed:
                run[0] = self.last[row.slot]
            for j, tok in enumerate(run):
                pos = row.start + j
                page = row.pages[pos // self.page_size]
                assert 0 < page < self.num_pages, f"page {page} is not a page a row may hold"
                self.kv.setdefault(page, [None] * self.page_size)[pos % self.page_size] = tok
            ends = range(row.start, row.start + len(run)) if verify else [row.start + len(run) - 1]
            contexts.append([self._read(row.pages, end) for end in ends])
        self._contexts = contexts
        return (ProgramKey.verify if verify else ProgramKey.ragged)(tokens, len(rows))

    def _read(self, pages: list[int], end: int) -> list[int]:
        """The tokens at positions 0..end as the row's page table holds them."""
        context = [self.kv.get(pages[pos // self.page_size], [None] * self.page_size)[pos % self.page_size]
                   for pos in range(end + 1)]
        assert None not in context, f"position {context.index(None)} read before it was written"
        return context

    def sample(self, rows: list[RowInput]) -> None:
        assert self._contexts is not None and len(rows) == len(self._contexts), "sample() does not follow a launch"
        sampled = []
        for row, contexts in zip(rows, self._contexts, strict=True):
            tokens = [next_token(c) for c in contexts]
            sampled += tokens
            if row.samples and not row.drafts:
                self.last[row.slot] = tokens[-1]
        self._contexts = None
        n = len(sampled)
        self._out = FakeOut(np.array(sampled, np.int32), np.zeros(n, np.float32), np.zeros((n, 1), np.int32),
                            np.zeros((n, 1), np.float32))

    def fetch(self, logprobs: bool = False) -> FakeOut:
        assert self._out is not None, "fetch() without a sample() before it"
        return self._out

    def release(self) -> None:
        self.released = True
