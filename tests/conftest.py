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
# them alone after the rest, which it runs on 2 workers.
SERIAL = ("tests/reliability/", "tests/server/")


def pytest_collection_modifyitems(session, config, items):
    """Mark the `serial` tests, then run the notebooks first: each starts a kernel (and one a server) with the
    default model, and the pytest process is smallest at the start of the session, so the peak memory stays
    well inside 24 GiB."""
    import pytest

    for item in items:
        if item.nodeid.startswith(SERIAL):
            item.add_marker(pytest.mark.serial)
    first = [item for item in items if item.nodeid.startswith("tests/test_notebooks.py")]
    rest = [item for item in items if not item.nodeid.startswith("tests/test_notebooks.py")]
    items[:] = first + rest
