"""Fixtures: one REAL serving pipeline (tiny random Qwen2 + the real Qwen2.5 tokenizer and template) for the
whole session, live uvicorn servers on 127.0.0.1 in front of it, and a `jaxchat serve` subprocess for SIGTERM.

The test hook for NaN logits is built in here, because the engine jits the model's forward once: the
service's model forward is wrapped so that any row whose position lies in `NAN_POSITIONS` gets all-NaN
logits. Only a request whose generation crosses those positions (a prompt of ~900 tokens) is affected;
every other test keeps its prompts and outputs far below them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.reliability.tiny import tiny_checkpoint
from tests.tiny_model import SERVE_ARGS

ROOT = Path(__file__).resolve().parents[2]
MAX_BATCH = 8
MAX_CONTEXT = 1024
STEP_TOKEN_BUCKETS = (64, 256)  # fewer step programs than the default: a faster warmup, same code paths
NAN_POSITIONS = (900, 910)  # [lo, hi): positions whose logits the hook turns into NaN
# the tiny model's serve shapes (tests/tiny_model.py), shared with the jump-forward and prefix-cache services
SIGTERM_SERVE_ARGS = SERVE_ARGS


def nan_hook(forward):
    import jax.numpy as jnp

    lo, hi = NAN_POSITIONS

    def forward_with_nan_rows(params, tokens, pools, step, *args, **kwargs):
        logits, pools = forward(params, tokens, pools, step, *args, **kwargs)
        positions = step.positions
        if kwargs.get("logits_index") is not None:  # the positions of the logits returned
            positions = jnp.take(positions, kwargs["logits_index"])
        bad = (positions >= lo) & (positions < hi)
        return jnp.where(bad[..., None], jnp.nan, logits), pools

    return forward_with_nan_rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- the `jaxchat serve` subprocess for the SIGTERM test: started at collection time so that its
# model load and warmup overlap with the in-process service's -----------------------------------------
class ServeProcess:
    def __init__(self, model_dir: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"jaxchat-reliability-serve-{os.getpid()}.log"
        self.log = open(self.log_path, "w+")  # noqa: SIM115
        cmd = [sys.executable, "-m", "jaxchat.cli", "serve", "--model", str(model_dir), "--port", str(self.port),
               "--log-level", "warning", *SIGTERM_SERVE_ARGS]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 240) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(self.base_url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"`jaxchat serve` did not start: {self.output()[-2000:]}")
            time.sleep(0.2)

    def output(self) -> str:
        self.log.flush()
        return self.log_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


_SERVE: list[ServeProcess] = []


@pytest.hookimpl(trylast=True)  # after `-m` has deselected: a run without the SIGTERM test starts no server
def pytest_collection_modifyitems(session, config, items) -> None:
    if any("serve_process" in getattr(item, "fixturenames", ()) for item in items):
        _SERVE.append(ServeProcess(tiny_checkpoint()))


def pytest_sessionfinish(session, exitstatus) -> None:
    for proc in _SERVE:
        proc.close()


@pytest.fixture(scope="session")
def serve_process() -> ServeProcess:
    if not _SERVE:
        _SERVE.append(ServeProcess(tiny_checkpoint()))
    return _SERVE[0]


# ---- the in-process service and live servers -------------------------------------------------------
@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    return tiny_checkpoint()


@pytest.fixture(scope="session")
def real_service(tiny_dir):
    import jaxchat.models as models
    from jaxchat.api import build_chat_service

    load = models.load_model

    def load_with_hook(*args, **kwargs):
        model = load(*args, **kwargs)
        model.forward = nan_hook(model.forward)
        return model

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(models, "load_model", load_with_hook)
        service = build_chat_service(tiny_dir, max_batch=MAX_BATCH, max_context=MAX_CONTEXT,
                                     step_token_buckets=STEP_TOKEN_BUCKETS)
    yield service
    service.engine.shutdown()


@pytest.fixture(scope="session")
def live_real(real_service):
    from tests.server.conftest import Live

    with Live(real_service) as server:
        yield server


@pytest.fixture
def idle_engine(real_service):
    """The shared engine, checked idle before and after a test."""
    from tests.reliability.support import leaked_slots, wait_idle

    engine = real_service.engine
    assert leaked_slots(wait_idle(engine)) == 0, "a previous test left a slot busy"
    yield engine
