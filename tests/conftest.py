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
