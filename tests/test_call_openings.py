"""bench/call_openings.py: which first tokens count as opening a call, and the confidence gate's arithmetic
(the threshold that reaches the irrelevance bar and what it leaves of each calling category)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "call_openings.py"


def _module():
    spec = importlib.util.spec_from_file_location("call_openings", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_envelope_and_marker_openings_are_summed_apart():
    top = [{"token": "```", "logprob": math.log(0.5)}, {"token": ' {"', "logprob": math.log(0.2)},
           {"token": "[", "logprob": math.log(0.05)}, {"token": "<tool_call>", "logprob": math.log(0.1)},
           {"token": "To", "logprob": math.log(0.1)}, {"token": "<", "logprob": math.log(0.05)}]
    envelope, marker = _module().opening_mass(top, "<tool_call>")
    assert envelope == pytest.approx(0.75)
    assert marker == pytest.approx(0.1)


def _rows(category, values):
    return [{"id": f"{category}_{i}", "category": category, "p_envelope": p, "p_marker": 0.0}
            for i, p in enumerate(values)]


def test_the_gate_drops_the_least_sure_irrelevant_calls_and_counts_what_it_costs(tmp_path):
    irrelevance = _rows("irrelevance", [0.1, 0.2, 0.6, 0.7, 0.9])  # the last three called
    simple = _rows("simple", [0.65, 0.8, 0.95, 0.5])  # right: the first three
    verdicts = {r["id"]: (i >= 2, i < 2) for i, r in enumerate(irrelevance)}
    verdicts |= {r["id"]: (True, i < 3) for i, r in enumerate(simple)}
    rows_file, calls_file = tmp_path / "rows.json", tmp_path / "calls.json"
    rows_file.write_text(json.dumps({"model": "m", "rows": irrelevance + simple}))
    runs = {"auto": {cat: [{"id": k, "calls": [["f", "{}"]] if called else [], "correct": right}
                           for k, (called, right) in verdicts.items() if k.startswith(cat)]
                     for cat in ("irrelevance", "simple")}}
    calls_file.write_text(json.dumps({"config": {}, "runs": {"http://x/v1": {"model": "m", "results": runs}}}))
    out = subprocess.run([sys.executable, str(SCRIPT), "--rows-from", str(rows_file), "--calls-from", str(calls_file),
                          "--irrelevance-bar", "0.8"], capture_output=True, text=True, timeout=60, check=True).stdout
    # 80% of 5 is 4 without a call: 2 have none, so the 2 least sure of the 3 calls (0.6, 0.7) go
    assert "must drop 2 of its 3 calls: every call whose reply opens with P(envelope) <= 0.70" in out
    # simple's right answers opened at 0.65, 0.8 and 0.95: the one at 0.65 falls behind the gate
    assert "simple               3/4 right now, 2/4 behind the gate" in out
    assert "irrelevance, called                3" in out
