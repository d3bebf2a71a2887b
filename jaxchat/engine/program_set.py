"""Which step programs an engine compiles, and when: the program set.

Contract: `PROGRAM_SETS` are the choices, `DEFAULT` the one `jaxchat serve` and `jaxchat.LLM` use unless told
otherwise:
- "background": the first set (`StepRunner.first_keys`: one ragged program, the largest decode step, their
  sampler) before serving, every other program on a background thread, each used from the step after it is ready;
- "all": every program before serving (the slowest start; no compile thread beside the engine);
- "first": the first set only, ever: every step runs as chunks of those programs (no speculative drafts, which
  need a verify program). The least compile time and memory, for short-lived engines and small machines.
`default_program_set()` reads `PROGRAMS_ENV` (the default of `serve --programs` and `LLM(programs=...)`), a
value that is not a choice being a clear ValueError.
"""

from __future__ import annotations

import os

PROGRAM_SETS = ("background", "all", "first")
DEFAULT = "background"
PROGRAMS_ENV = "JAXCHAT_PROGRAMS"


def check_program_set(programs: str) -> str:
    if programs not in PROGRAM_SETS:
        raise ValueError(f"programs {programs!r}: choose one of {', '.join(PROGRAM_SETS)}")
    return programs


def default_program_set() -> str:
    raw = os.environ.get(PROGRAMS_ENV, "").strip()
    if not raw:
        return DEFAULT
    if raw not in PROGRAM_SETS:
        raise ValueError(f"{PROGRAMS_ENV}={raw!r}: choose one of {', '.join(PROGRAM_SETS)}")
    return raw
