"""Multi-host serving with several processes on this machine: two `jaxchat serve` processes with 4 CPU devices
each join one JAX runtime (`--coordinator/--num-processes/--process-id`, gloo collectives) and serve a tiny
model tensor-parallel over all 8 devices.

- The same mixed batch (chat and completions, constrained by a json_schema and not, streamed and not, sent
  at once) gives the same greedy outputs from the two-process cluster as from one process with 8 devices.
- Each process reads only its own blocks of the safetensors file: the bytes each reports are half of what one
  process reads (every weight of this model is split 8 ways; the norms are replicated), and one process
  reads exactly the checkpoint's tensor bytes (from the file's own header).
- SIGTERM to process 0 stops both (status 0). Killing the follower mid-request: process 0 answers the open
  requests with 503 and exits non-zero within 30 s. Killing process 0: the follower exits within 30 s.
With `JAXCHAT_PROGRAMS=background` the cluster also answers the batch alike once the background programs are all
ready (process 0 takes each up only when the follower has it). Every process a test starts is killed in its
`finally`, so none outlives it.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import signal
import struct
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.serve_process import ROOT, free_port, start_serve
from tests.tiny_model import tiny_chat_model

SERVE_ARGS = ["--max-batch", "4", "--max-context", "64", "--max-step-tokens", "16"]  # one ragged program (CI time)
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
REQUESTS = [  # (endpoint, body); greedy, several shapes of request in one batch
    ("chat", {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 10, "logprobs": True}),
    ("chat", {"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 12, "stream": True}),
    ("chat", {"messages": [{"role": "user", "content": "A person, as JSON."}], "max_tokens": 24,
              "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}}),
    ("chat", {"messages": [{"role": "user", "content": "Another one."}], "max_tokens": 24, "stream": True,
              "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA,
                                                                         "strict": True}}}),
    ("completions", {"prompt": "Once upon a time", "max_tokens": 12}),
]


def _tiny_net(vocab: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(  # 8 heads and 8 kv heads: attention splits over 8 devices too
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=8, max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=151643,
        eos_token_id=151645))


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    try:
        return tiny_chat_model(tmp_path_factory.mktemp("model8"), model=_tiny_net)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"default model's tokenizer not fetched: {exc}")


def _env(devices: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return {**env, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": str(ROOT)}


class Cluster:
    """A leader (serving HTTP) and one follower; `kill()` leaves no process behind."""

    def __init__(self, model: Path, logs: Path) -> None:
        coordinator = f"127.0.0.1:{free_port()}"
        flags = ["--model", str(model), *SERVE_ARGS, "--coordinator", coordinator, "--num-processes", "2"]
        self.follower_log = logs / "follower.log"
        self.leader_log = logs / "leader.log"
        with open(self.follower_log, "w") as out:
            self.follower = subprocess.Popen(
                [sys.executable, "-m", "jaxchat.cli", "serve", *flags, "--process-id", "1"], stdout=out,
                stderr=subprocess.STDOUT, cwd=ROOT, env=_env(4))
        self.leader = None
        try:
            self.leader, self.base = start_serve([*flags, "--process-id", "0"], self.leader_log, env=_env(4),
                                                 timeout=600)
        except BaseException:
            self.kill()
            raise

    def kill(self) -> None:
        for proc in (self.leader, self.follower):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)


def _post(base: str, endpoint: str, body: dict, timeout: float = 300) -> tuple[int, object]:
    """(status, the output text or JSON error) of one request; a stream's deltas are joined."""
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
        model_id = json.loads(r.read())["data"][0]["id"]
    body = {"model": model_id, "temperature": 0, **body}
    req = urllib.request.Request(base + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())
    if not body.get("stream"):
        choice = json.loads(raw)["choices"][0]
        if body.get("logprobs"):  # the tokens too: this tiny model's chat replies are mostly special tokens
            return status, [choice["message"]["content"], [t["token"] for t in choice["logprobs"]["content"]]]
        return status, choice["text"] if endpoint == "completions" else choice["message"]["content"]
    text = []
    for line in raw.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[6:]).get("choices") or ():
                text.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    return status, "".join(text)


def _batch(base: str) -> list:
    with cf.ThreadPoolExecutor(len(REQUESTS)) as pool:
        return list(pool.map(lambda r: _post(base, *r), REQUESTS))


def _bytes_read(log: Path) -> int:
    return int(re.search(r"Read (\d+) bytes of tensor data", log.read_text()).group(1))


def _checkpoint_tensor_bytes(model: Path) -> tuple[int, int]:
    """(all tensors' bytes, the norms' bytes) from the safetensors header."""
    with open(model / "model.safetensors", "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    sizes = {n: t["data_offsets"][1] - t["data_offsets"][0] for n, t in header.items() if n != "__metadata__"}
    return sum(sizes.values()), sum(v for n, v in sizes.items() if "norm" in n)


def _wait_exit(proc: subprocess.Popen, within: float) -> int | None:
    try:
        return proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        return None


def test_two_processes_serve_what_one_process_with_8_devices_serves(model, tmp_path):
    proc, base = start_serve(["--model", str(model), *SERVE_ARGS], tmp_path / "single.log", env=_env(8), timeout=600)
    try:
        single = _batch(base)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert all(status == 200 for status, _ in single), single
    for (_, body), (_, text) in zip(REQUESTS, single, strict=True):
        if "response_format" in body:
            assert text.startswith('{"name"'), text  # constrained (max_tokens may cut the object short)

    cluster = Cluster(model, tmp_path)
    try:
        assert _batch(cluster.base) == single
        if os.environ.get("JAXCHAT_PROGRAMS") == "background":  # what users get (this suite's default: "first")
            _wait_all_programs(cluster.base)  # adopted by process 0 once the follower had each
            assert _batch(cluster.base) == single
        cluster.leader.send_signal(signal.SIGTERM)  # SIGTERM to process 0 stops both
        assert _wait_exit(cluster.leader, 60) == 0, cluster.leader_log.read_text()[-2000:]
        assert _wait_exit(cluster.follower, 60) == 0, cluster.follower_log.read_text()[-2000:]
    finally:
        cluster.kill()

    total, norms = _checkpoint_tensor_bytes(model)
    assert _bytes_read(tmp_path / "single.log") == total
    leader, follower = _bytes_read(cluster.leader_log), _bytes_read(cluster.follower_log)
    assert leader == follower == (total - norms) // 2 + norms, (leader, follower, total, norms)


def test_killing_the_follower_fails_open_requests_with_503_and_stops_process_0(model, tmp_path):
    cluster = Cluster(model, tmp_path)
    try:
        long = ("completions", {"prompt": "Once upon a time", "max_tokens": 48, "ignore_eos": True})
        with cf.ThreadPoolExecutor(2) as pool:
            open_requests = [pool.submit(_post, cluster.base, *long) for _ in range(2)]
            _wait_running(cluster.base, 2)
            cluster.follower.kill()
            killed = time.monotonic()
            answers = [f.result(timeout=60) for f in open_requests]
        assert [status for status, _ in answers] == [503, 503], answers
        assert all("lost a process" in a[1]["error"]["message"] for a in answers), answers
        status = _wait_exit(cluster.leader, 30 - (time.monotonic() - killed))
        assert status not in (None, 0), cluster.leader_log.read_text()[-2000:]
    finally:
        cluster.kill()


def test_killing_process_0_stops_the_follower(model, tmp_path):
    cluster = Cluster(model, tmp_path)
    try:
        cluster.leader.kill()
        assert _wait_exit(cluster.follower, 30) not in (None, 0), cluster.follower_log.read_text()[-2000:]
    finally:
        cluster.kill()


def _wait_all_programs(base: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(base + "/health", timeout=10) as r:
            health = json.loads(r.read())
        if health.get("programs_ready") == health.get("programs_total"):
            return
        time.sleep(0.5)
    pytest.fail(f"the programs were not all ready within {timeout:.0f} s: {health}")


def _wait_running(base: str, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
            found = re.search(r"^jaxchat_requests_running (\S+)$", r.read().decode(), re.M)
        if found and float(found.group(1)) >= n:
            return
        time.sleep(0.05)
    pytest.fail(f"{n} requests were not running within {timeout:.0f} s")
