"""The per-file timing plugin (tests/file_times.py) and the test order derived from its table."""

from __future__ import annotations

import json
from pathlib import Path

from tests import conftest, file_times

ROOT = Path(__file__).resolve().parents[1]


def test_longest_first_names_only_existing_files():
    assert conftest.LONGEST_FIRST, "the measured table lists no file slower than the threshold"
    missing = [name for name in conftest.LONGEST_FIRST if not (ROOT / name).is_file()]
    assert not missing, f"tests/file_times.json names files that do not exist: {missing}"


def test_longest_first_is_the_tables_order(tmp_path):
    table = tmp_path / "times.json"
    table.write_text(json.dumps({"files": {"tests/b.py": 30.0, "tests/a.py": 90.0, "tests/c.py": 1.0,
                                           "tests/d.py": 30.0}, "tests": 4, "wall": 151.0}))
    assert conftest.longest_first(table) == ("tests/a.py", "tests/b.py", "tests/d.py")


def test_merge_adds_up_runs_and_table_ranks_them(tmp_path):
    a, b = tmp_path / "parallel.json", tmp_path / "serial.json"
    a.write_text(json.dumps({"files": {"tests/x.py": 2.0, "tests/y.py": 5.0}, "tests": 3, "wall": 10.0}))
    b.write_text(json.dumps({"files": {"tests/x.py": 4.5}, "tests": 1, "wall": 6.0}))
    merged = file_times.merge([str(a), str(b)])
    assert merged == {"files": {"tests/x.py": 6.5, "tests/y.py": 5.0}, "tests": 4, "wall": 16.0}
    assert file_times.table(merged["files"], top=1) == [("tests/x.py", 6.5)]


def test_record_sums_every_phase_of_a_files_tests():
    class Report:
        def __init__(self, nodeid, duration):
            self.nodeid, self.duration = nodeid, duration

    before = dict(file_times._seconds)
    name = "tests/not_a_real_file_for_timing.py"
    for phase_seconds in (0.25, 1.5, 0.25):
        file_times.record(Report(f"{name}::test_one", phase_seconds))
    assert file_times._seconds[name] - before.get(name, 0.0) == 2.0
    del file_times._seconds[name]
