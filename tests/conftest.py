"""Session-wide pytest hooks: the reliability tests' counts are printed at the end of every run, so CI's
output shows requests sent, 4xx, 5xx, completed, leaked slots and memory growth even when all pass."""

from __future__ import annotations


def pytest_terminal_summary(terminalreporter):
    import sys

    support = sys.modules.get("tests.reliability.support")
    lines = getattr(support, "REPORTS", None)
    if lines:
        terminalreporter.section("reliability counts")
        for line in lines:
            terminalreporter.write_line(line)


# Tests that bound wall time, count compiles on a shared service or signal servers: scripts/test.sh runs
# them alone after the rest, which it runs on 2 workers. These folders are marked whole here; a timing-sensitive
# test elsewhere carries `@pytest.mark.serial` itself (tests/engine/test_bursts.py).
SERIAL = ("tests/reliability/", "tests/server/")


# The longest files first, longest to shortest as measured in CI (each runs whole on one xdist worker, and
# scripts/test.sh keeps this order with --no-loadscope-reorder): started last, one of them would run alone at
# the end while the other worker idles. The notebooks come after the parity file, so that the default-model
# server (same shapes) has compiled their programs into the shared compilation cache by the time they start.
LONGEST_FIRST = ("tests/e2e/test_default_model_server.py", "tests/models/test_parity.py", "tests/test_notebooks.py",
                 "tests/e2e/test_truncation.py", "tests/e2e/test_multihost.py", "tests/constrain/test_walk.py",
                 "tests/models/test_real_weights.py",
                 "tests/engine/test_real_model.py", "tests/models/test_hybrids.py", "tests/e2e/test_family_formats.py",
                 "tests/models/test_int8.py", "tests/e2e/test_stream_agreement.py", "tests/engine/test_attention_spans.py")


def pytest_collection_modifyitems(session, config, items):
    """Mark the `serial` tests, then order the longest files first (the notebooks among them: each starts a
    kernel, and one a server, with the default model while the pytest processes are still small; measured peak
    well inside 24 GiB)."""
    import pytest

    for item in items:
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)

    def rank(item) -> int:
        for i, prefix in enumerate(LONGEST_FIRST):
            if item.nodeid.startswith(prefix):
                return i
        return len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: the order within each file and among the rest is kept
