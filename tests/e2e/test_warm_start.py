"""A warm start compiles nothing: `jaxchat serve` started twice with a tiny model on one `--compile-cache`
directory compiles its programs the first time and loads every one of them from that cache the second time.

Each start runs as a subprocess until /health answers; its `/metrics` gives the XLA compiles of the whole
process (`jaxchat_compiles`, cache loads included), the persistent-cache hits among them
(`jaxchat_compile_cache_hits`) and the step programs loaded as serialized executables, neither traced nor
compiled (`jaxchat_programs_loaded`). (`--no-compile-cache` is tested in tests/test_cli.py, without a model.)
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from pathlib import Path

import pytest

from tests.serve_process import start_serve, stop
from tests.tiny_model import SERVE_ARGS, tiny_chat_model  # the tiny model's serve shapes, compiled cold here


def start_and_read_metrics(model: Path, *cache_args: str, log: Path, env_cache: Path | None = None) -> dict:
    """Start `jaxchat serve` on `model` (with JAX_COMPILATION_CACHE_DIR=`env_cache`, or unset), wait for /health,
    run one greedy completion, read /metrics, stop it with SIGTERM."""
    env = dict(os.environ)
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    if env_cache is not None:
        env["JAX_COMPILATION_CACHE_DIR"] = str(env_cache)
    proc, base = start_serve(["--model", str(model), *SERVE_ARGS, "--programs", "background", *cache_args], log,
                             env=env, timeout=300)
    try:
        with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
            model_id = json.loads(r.read())["data"][0]["id"]
        body = json.dumps({"model": model_id, "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}).encode()
        request = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as r:  # the programs run, not only load
            completion = json.loads(r.read())["choices"][0]["text"]
        health = wait_all_programs(base)
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            text = r.read().decode()
    finally:
        stop(proc, timeout=60)
    found = {m.group(1): float(m.group(2))
             for m in re.finditer(r"^jaxchat_(compiles|compile_cache_hits|programs_loaded) (\S+)$", text, re.M)}
    return {**found, "completion": completion, "programs_total": health["programs_total"]}


def wait_all_programs(base: str, timeout: float = 300) -> dict:
    """Poll /health until every step program is ready (the server answers once the first ones are; the others
    compile in the background); its last body."""
    deadline = time.monotonic() + timeout
    while True:
        with urllib.request.urlopen(base + "/health", timeout=10) as r:
            health = json.loads(r.read())
        if health["programs_ready"] == health["programs_total"] or time.monotonic() > deadline:
            return health
        time.sleep(0.5)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    try:
        return tiny_chat_model(tmp_path_factory.mktemp("model"))
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"default model's tokenizer not fetched: {exc}")


def test_second_start_on_one_cache_compiles_nothing(model, tmp_path):
    cache = tmp_path / "xla-cache"
    cold = start_and_read_metrics(model, "--compile-cache", str(cache), log=tmp_path / "cold.log")
    assert cold["compiles"] > 0 and cold["compile_cache_hits"] == 0 and cold["programs_loaded"] == 0, cold
    programs = cold["programs_total"]
    cold_log = (tmp_path / "cold.log").read_text()
    first = int(re.search(rf"Warm-up: (\d+) of {programs} programs", cold_log).group(1))  # then the background
    assert 2 <= first < programs and re.search(rf"{programs} of {programs} programs ready", cold_log), cold_log
    assert programs >= 3 and len(list((cache / "executables").glob("*.xla"))) == programs
    warm = start_and_read_metrics(model, "--compile-cache", str(cache), log=tmp_path / "warm.log")
    assert warm["programs_loaded"] == programs, (programs, warm)  # every step program came back from disk ...
    assert warm["compile_cache_hits"] == warm["compiles"], warm  # ... and whatever else XLA compiled was cached
    warm_log = (tmp_path / "warm.log").read_text()
    assert re.search(rf"Warm-up: {first} of {programs} programs in [0-9.]+ s \(0 compiled", warm_log)
    # the cold start recorded its first programs, and the warm one loaded them beside its weights
    (record,) = (cache / "executables").glob("first-set-*.json")
    assert len(json.loads(record.read_text())) == first
    assert re.search(rf"{first} loaded as executables, {first} of them ahead, beside the weights", warm_log), warm_log
    assert warm["completion"] == cold["completion"]  # the loaded programs compute what the compiled ones did

