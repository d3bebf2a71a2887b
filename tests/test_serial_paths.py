"""tests/serial_paths.py names every file that holds a serial test, and scripts/test.sh's serial pass uses it."""

from __future__ import annotations

from tests.serial_paths import MARKER, ROOT, serial_paths


def test_every_serial_test_lives_under_a_listed_path():
    paths = serial_paths()
    assert all((ROOT / p).exists() for p in paths)
    assert "tests/engine/test_bursts.py" in paths  # marks one test serial itself, outside the serial folders
    for f in (ROOT / "tests").rglob("test_*.py"):
        name = str(f.relative_to(ROOT))
        if MARKER.search(f.read_text()):
            assert name.startswith(tuple(paths)), name
    assert "tests/test_serial_paths.py" not in paths  # mentions the marker without using it


def test_the_serial_pass_of_the_test_script_collects_only_those_paths():
    script = (ROOT / "scripts" / "test.sh").read_text()
    assert "-m tests.serial_paths" in script and '-m serial "${serial_args[@]}"' in script
