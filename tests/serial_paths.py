"""The paths that hold every `serial` test: tests/conftest.py's SERIAL folders and each test file that marks a test
`@pytest.mark.serial` itself. scripts/test.sh runs its serial pass over these paths only (when given no arguments),
so that pass collects a few hundred tests instead of importing every test module a third time.

`python -m tests.serial_paths` prints them, one per line."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARKER = re.compile(r"^\s*@pytest\.mark\.serial\b", re.M)  # a decorator line, not a mention


def serial_paths() -> list[str]:
    from tests.conftest import SERIAL

    marked = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                    if MARKER.search(p.read_text()) and not str(p.relative_to(ROOT)).startswith(SERIAL))
    return [*SERIAL, *marked]


if __name__ == "__main__":
    print("\n".join(serial_paths()))
