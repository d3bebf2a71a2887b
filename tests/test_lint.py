"""The code style gate: `ruff check` over the whole project passes (rules in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert ruff, "ruff is a test dependency (pip install -e '.[test]')"
    result = subprocess.run([ruff, "check", str(ROOT)], capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-4000:]
