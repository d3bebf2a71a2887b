"""6. Soak (reduced for CI): 120 sequential and concurrent requests through `bench.soak.run_soak` against a live
server on the REAL pipeline; resident memory grows < 10% after the first 50, no compile, the grammar cache
stays the same size, nothing leaks. `python bench/soak.py` runs the full 500.
"""

from __future__ import annotations

import asyncio

from bench.soak import check, run_soak, summary
from tests.reliability.support import REPORTS

REQUESTS = 120
WARMUP = 50


def test_soak_reduced(real_service, live_real, idle_engine):
    result = asyncio.run(run_soak(live_real.base_url, real_service, total=REQUESTS, warmup=WARMUP,
                                  concurrency=16, log=None))
    line = summary("soak", result)
    REPORTS.append(line.strip())
    print("\n" + line)
    assert result["counts"]["sent"] == REQUESTS
    assert check(result, max_growth=0.10) == []
