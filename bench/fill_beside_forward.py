"""Where the mask fill goes on a CPU "device": beside the forward (the engine's overlapped loop) or after it with
every core (issue 51: a question bench, no bar).

On an accelerator the host's mask fill runs while the device computes the forward, so it is hidden. On a CPU
host XLA's forward runs on the same cores as xgrammar's fill. This bench asks whether arranging the two
differently gains anything there. It takes six rows of the serve mix's costly families (the regex and the EBNF
grammar of `bench/serve.py --constraint mix`, three each, five tokens into their outputs, on the default model's
tokenizer). Beside them runs a stand-in forward: an XLA:CPU program of the default model's decode shape, 24
layers of [16, 896] x [896, 4864] x [4864, 896] and the 151,936-wide head, about the real step's cost on this
host. It times, alternating, 12 times each:

- `forward alone`, `fill alone` (xgrammar's `BatchGrammarMatcher` with 1 thread, the default here, and with every
  core);
- `overlapped`: the forward dispatched, the fill (1 thread, or every core) run while it computes, then waited for;
- `after`: the forward waited for, then the fill (1 thread, or every core).

It prints each p50 and how much each arrangement adds to the forward alone. The engine's arrangement is the first
`overlapped` one; what it adds is the part of the fill that the forward's own idle core time does not absorb.

    .venv/bin/python bench/fill_beside_forward.py
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import xgrammar as xgr

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mix_mask_fill import TEXTS, VOCAB, mix_constraint_maker  # noqa: E402

from jaxchat.bitmask import mask_words  # noqa: E402

ROWS, HIDDEN, FFN, LAYERS, PAST_TOKENS, REPEATS = 16, 896, 4864, 24, 5, 12


def costly_matchers() -> list[xgr.GrammarMatcher]:
    """Three regex and three EBNF rows of the serve mix, each `PAST_TOKENS` tokens into its output."""
    tok, make = mix_constraint_maker()
    matchers = []
    for family in ("regex", "ebnf") * 3:
        matcher = make(family)[0].fresh_matcher()
        for token in tok.encode(TEXTS[family], add_special_tokens=False)[:PAST_TOKENS]:
            if not matcher.accept_token(token):
                raise SystemExit(f"{family}: the sample text left the grammar")
        matchers.append(matcher)
    return matchers


def stand_in_forward():
    """A jitted XLA:CPU program of the default model's decode shape, and its input."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    up = jax.random.normal(keys[0], (HIDDEN, FFN), jnp.float32) * 0.02
    down = jax.random.normal(keys[1], (FFN, HIDDEN), jnp.float32) * 0.02
    head = jax.random.normal(keys[2], (HIDDEN, VOCAB), jnp.float32) * 0.02

    @jax.jit
    def forward(x):
        for _ in range(LAYERS):
            x = x + jnp.tanh(x @ up) @ down
        return x @ head

    x = jnp.ones((ROWS, HIDDEN), jnp.float32)
    forward(x).block_until_ready()
    return forward, x


def main() -> int:
    matchers = costly_matchers()
    masks = np.empty((len(matchers), mask_words(VOCAB)), np.int32)
    cores = os.cpu_count() or 1
    pools = {1: xgr.BatchGrammarMatcher(1), cores: xgr.BatchGrammarMatcher(cores)}
    forward, x = stand_in_forward()

    def fill(threads: int) -> None:
        pools[threads].batch_fill_next_token_bitmask(matchers, masks)

    def timed(run) -> float:
        t0 = time.perf_counter()
        run()
        return time.perf_counter() - t0

    def overlapped(threads: int) -> None:
        out = forward(x)
        fill(threads)
        out.block_until_ready()

    def after(threads: int) -> None:
        forward(x).block_until_ready()
        fill(threads)

    cases = {"forward alone": lambda: forward(x).block_until_ready()}
    for threads in pools:
        cases[f"fill alone, {threads} thread(s)"] = lambda t=threads: fill(t)
        cases[f"overlapped, fill on {threads} thread(s)"] = lambda t=threads: overlapped(t)
        cases[f"after, fill on {threads} thread(s)"] = lambda t=threads: after(t)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(REPEATS):
        for name, run in cases.items():
            times[name].append(timed(run))
    p50 = {name: statistics.median(ts) * 1e3 for name, ts in times.items()}
    base = p50["forward alone"]
    print(f"{len(matchers)} rows (regex, EBNF) beside a {ROWS}-row stand-in forward, {cores} cores, p50 of "
          f"{REPEATS}:")
    for name, ms in p50.items():
        added = "" if name.startswith(("forward", "fill")) else f"  adds {ms - base:6.1f} ms to the forward"
        print(f"  {name:34} {ms:7.1f} ms{added}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
