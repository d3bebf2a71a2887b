"""Per-file wall time of a pytest run, as a plugin the root conftest loads.

Every test report's duration (setup, call and teardown, module fixtures included in the first test's setup)
is summed per file on the process that writes the terminal summary (the xdist controller or a plain run).
At the end the slowest files are printed and, when `JAXCHAT_TEST_TIMES` names a path, the whole table is
written there as JSON: {"files": {path: seconds}, "tests": n, "wall": seconds, "slowest": {"nodeid phase":
seconds}} (`slowest`: the 200 longest setup/call/teardown phases, to see inside a slow file). `python -m tests.file_times
A.json B.json ...` merges such files (a file met twice adds up) and prints the top of the table as markdown.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

_seconds: dict[str, float] = defaultdict(float)
_tests: set[str] = set()
_phases: dict[str, float] = {}
SLOWEST_PHASES = 200
_started = time.monotonic()


def record(report) -> None:
    """Add one test report's duration to its file's sum."""
    path = report.nodeid.split("::", 1)[0]
    duration = float(getattr(report, "duration", 0.0) or 0.0)
    _seconds[path] += duration
    _tests.add(report.nodeid)
    _phases[f"{report.nodeid} {getattr(report, 'when', '?')}"] = round(duration, 2)


def table(seconds: dict[str, float], top: int = 20) -> list[tuple[str, float]]:
    """The `top` slowest files, slowest first (ties by path, so the order is stable)."""
    return sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))[:top]


def write_summary(write_line) -> None:
    """Print the slowest files and write the JSON table where JAXCHAT_TEST_TIMES points."""
    if not _seconds:
        return
    write_line("slowest files (seconds summed over their tests' setup, call and teardown):")
    for path, secs in table(_seconds):
        write_line(f"{secs:9.1f}  {path}")
    out = os.environ.get("JAXCHAT_TEST_TIMES")
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"files": dict(sorted(_seconds.items())), "tests": len(_tests),
                                         "wall": round(time.monotonic() - _started, 1),
                                         "slowest": dict(sorted(_phases.items(), key=lambda kv: -kv[1])[:SLOWEST_PHASES])},
                                        indent=1))


def merge(paths: list[str]) -> dict:
    """Merge several JSON tables written by `write_summary` (one per pytest run)."""
    files: dict[str, float] = defaultdict(float)
    tests = 0
    wall = 0.0
    for p in paths:
        data = json.loads(Path(p).read_text())
        for path, secs in data["files"].items():
            files[path] += secs
        tests += data["tests"]
        wall += data["wall"]
    return {"files": dict(files), "tests": tests, "wall": round(wall, 1)}


def main(argv: list[str]) -> int:
    top = 20
    if argv[:1] == ["--top"]:
        top, argv = int(argv[1]), argv[2:]
    data = merge(argv)
    print(f"{data['tests']} test reports, {data['wall']:.0f} s of pytest wall time in {len(argv)} run(s)\n")
    print("| file | seconds |\n| --- | ---: |")
    for path, secs in table(data["files"], top):
        print(f"| `{path}` | {secs:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
