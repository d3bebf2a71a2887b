"""Lifecycle: an engine released (`shutdown()`, a `with` block, or dropping its last reference) stops its thread and
frees its device state and compiled programs, so one process can build and drop engines in turn (as a notebook
user tries configurations) without running out of memory mappings or memory. Runs in a fresh process: its
mappings and RSS are measured after each engine is dropped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import gc, json, sys, threading
    from jaxchat.engine.engine import Engine
    from jaxchat.engine.types import GenerationRequest, SamplingParams
    from tests.engine.helpers import tiny_byte_qwen2

    def mappings():
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096

    model = tiny_byte_qwen2(sys.argv[1])
    out = []
    before = mappings()
    for i in range(8):
        engine = Engine(model, max_batch=2, max_context=64, step_token_buckets=(16,), page_size=4)
        built = mappings()
        done = threading.Event()
        engine.submit(GenerationRequest([5, 6, 7, i], SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)),
                      lambda o: o.finished and done.set())
        assert done.wait(300)
        if i % 2:
            engine.shutdown()
        else:
            with engine:
                pass
        thread = engine.core.thread
        state = engine.runner.state
        if i == 3:  # no explicit close at all: the finaliser runs when the last reference goes
            engine = Engine(model, max_batch=2, max_context=64, step_token_buckets=(16,), page_size=4)
            core = engine.core
            del engine
            gc.collect()
            assert core.stopped and core.thread is None, "dropping the engine did not stop it"
        engine = None
        gc.collect()
        alive = [t.name for t in threading.enumerate() if t.name == "jaxchat-engine"]
        out.append({"before": before, "built": built, "maps": mappings(), "rss": rss(), "threads": len(alive),
                    "state": state is None})
    print(json.dumps(out))
""")


@pytest.mark.timeout(1500)
def test_building_and_dropping_eight_engines_keeps_mappings_and_memory_bounded(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jax-cache"))  # engines 2..8 load their programs
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "model")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=1400, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rounds = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(r["threads"] == 0 and r["state"] for r in rounds), rounds  # every thread stopped, state released
    maps, rss = [r["maps"] for r in rounds], [r["rss"] for r in rounds]
    one_engine = rounds[0]["built"] - rounds[0]["before"]  # the mappings a live engine holds
    assert one_engine > 0, rounds
    # after the first two engines (one-time imports, caches, allocator arenas) nothing keeps growing: six more
    # engines built and dropped add less than one engine's mappings, and memory stays within 150 MB
    assert maps[-1] - maps[1] < one_engine, (one_engine, maps)
    assert rss[-1] - rss[1] < 150 << 20, rss
