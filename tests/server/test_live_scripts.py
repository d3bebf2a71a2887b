"""The stdlib live checks (tests/live) against the live server with the fake service, which is scripted
to honour tool_choice, response_format and the thinking switch, so each check passes for its reason."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.live import livelib, run_all
from tests.server.conftest import API_KEY, Live
from tests.server.fake import FakeService

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("name", "check"), run_all.ALL_CHECKS, ids=[n for n, _ in run_all.ALL_CHECKS])
def test_live_check(live, name, check):
    check(livelib.Context(livelib.Client(live.base_url + "/v1"), "fake-model", max_tokens=256))


def test_live_check_catches_a_wrong_param():
    ctx = livelib.Context(livelib.Client("http://unused"), "fake-model")
    with pytest.raises(livelib.CheckFailed):
        livelib.expect(
            livelib.schema_errors(
                {"age": -1}, {"type": "object", "required": ["name"], "properties": {"age": {"minimum": 0}}}
            )
            == [],
            "bad",
        )
    assert ctx.body("hi")["messages"] == [{"role": "user", "content": "hi"}]


def test_run_all_script_with_api_key():
    with Live(FakeService(), api_key=API_KEY) as server:
        args = ["--base-url", server.base_url, "--model", "fake-model", "--api-key", API_KEY]
        proc = subprocess.run(
            [sys.executable, "tests/live/run_all.py", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{len(run_all.ALL_CHECKS)} passed, 0 failed" in proc.stdout
        bad = subprocess.run(
            [
                sys.executable,
                "tests/live/run_all.py",
                "--base-url",
                server.base_url,
                "--model",
                "fake-model",
                "--only",
                "contract.chat",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert bad.returncode == 1 and "FAIL contract.chat" in bad.stdout  # no key: 401


def test_run_checks_runs_checks_together_and_reports_them_in_order():
    """`--concurrency 2`: two checks that can only finish together (a barrier) both pass; results keep the list's
    order and a failing check is reported as failed."""
    import threading

    together = threading.Barrier(2, timeout=20)

    def failing(ctx):
        raise livelib.CheckFailed("wrong")

    checks = [("a", lambda ctx: together.wait()), ("b", lambda ctx: together.wait()), ("c", failing)]
    results = livelib.run_checks(checks, livelib.Context(None, "m"), concurrency=2)
    assert [(name, outcome) for name, outcome, _ in results] == [("a", "ok"), ("b", "ok"), ("c", "FAIL: wrong")]
    alone = livelib.run_checks(checks[2:], livelib.Context(None, "m"), only="c")
    assert [outcome for _, outcome, _ in alone] == ["FAIL: wrong"]
