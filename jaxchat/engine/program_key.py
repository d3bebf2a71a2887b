"""Which step program a step runs: one typed key per compiled program (no JAX).

Contract: `ProgramKey(kind, tokens, rows)`, a named tuple (hashable; equal keys name one program):
- "decode": `rows` rows that each run one token (`tokens` == `rows`);
- "ragged": up to `tokens` tokens of up to `rows` rows, packed back to back (prompt chunks beside decoding rows);
- "verify": a ragged step whose every token is sampled (the drafts of speculative decoding are checked);
- "sample": the sampler of `rows` positions (`tokens` == `rows`), shared by every forward that samples as many.
Build them with `ProgramKey.decode(r)`, `.ragged(t, r)`, `.verify(t, r)` and `.sample(n)`. `samples` is how many
positions a forward's sampler samples (one per row, or every token of a verify step) and `sampler()` that sampler's
key; `name` is how logs, progress bars and lowering reports spell it ("ragged/64/4", "sample/4").
"""

from __future__ import annotations

from typing import NamedTuple

KINDS = ("decode", "ragged", "verify", "sample")
FORWARD_KINDS = KINDS[:3]


class ProgramKey(NamedTuple):
    kind: str
    tokens: int
    rows: int

    @classmethod
    def decode(cls, rows: int) -> ProgramKey:
        return cls("decode", int(rows), int(rows))

    @classmethod
    def ragged(cls, tokens: int, rows: int) -> ProgramKey:
        return cls("ragged", int(tokens), int(rows))

    @classmethod
    def verify(cls, tokens: int, rows: int) -> ProgramKey:
        return cls("verify", int(tokens), int(rows))

    @classmethod
    def sample(cls, rows: int) -> ProgramKey:
        return cls("sample", int(rows), int(rows))

    @property
    def is_sampler(self) -> bool:
        return self.kind == "sample"

    @property
    def samples(self) -> int:
        """How many positions this program's sampler samples."""
        return self.tokens if self.kind in ("verify", "sample") else self.rows

    def sampler(self) -> ProgramKey:
        return ProgramKey.sample(self.samples)

    @property
    def name(self) -> str:
        if self.kind in ("decode", "sample"):
            return f"{self.kind}/{self.rows}"
        return f"{self.kind}/{self.tokens}/{self.rows}"
