"""Data-parallel replicas (issue 48): the routing policy with fake engines, the device split and the default,
and (in a subprocess with 4 fake CPU devices, `replicas_case.py`) `--data-parallel 2` giving one device's greedy
tokens with the requests spread over both replicas."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxchat.engine import replicas
from jaxchat.engine.types import EngineStats, GenerationOutput, GenerationRequest, SamplingParams

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


class FakeEngine:
    """Holds each submitted request open until `finish(rid)`; `generate` yields one delta, then the last."""

    model, tokenizer, eos_token_ids = object(), None, (0,)

    def __init__(self) -> None:
        self.open: dict[str, object] = {}
        self.served: list[str] = []
        self.announced = 0

    def submit(self, request, callback):
        self.open[request.request_id] = callback
        self.served.append(request.request_id)
        return request.request_id

    def finish(self, rid: str) -> None:
        self.open.pop(rid)(GenerationOutput(rid, [1], "x", finished=True, finish_reason="stop"))

    def abort(self, rid: str) -> None:
        if rid in self.open:
            self.finish(rid)

    async def generate(self, request):
        self.served.append(request.request_id)
        yield GenerationOutput(request.request_id, [1], "x", finished=True, finish_reason="stop")

    def expect_request(self):
        self.announced += 1
        return None

    def prompt_fits(self, tokens: int) -> bool:
        return tokens < 100

    max_context = 128

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self.open), max_batch=4, free_slots=4 - len(self.open), max_context=128,
                           kv_page_size=16, steps=1)

    def start(self) -> None: ...

    def shutdown(self) -> None: ...


def _request(rid: str) -> GenerationRequest:
    return GenerationRequest([1, 2], SamplingParams(max_tokens=2), request_id=rid)


def test_requests_go_to_the_least_loaded_replica_and_finished_ones_free_it():
    engines = [FakeEngine(), FakeEngine()]
    front = replicas.Replicas(engines)
    for rid in "abcde":
        front.submit(_request(rid), lambda out: None)
    assert engines[0].served == ["a", "c", "e"] and engines[1].served == ["b", "d"]  # both serve rows
    assert front.loads() == [3, 2] and front.stats().running == 5 and front.stats().max_batch == 8
    engines[0].finish("a")
    engines[0].finish("c")
    assert front.loads() == [1, 2]
    front.submit(_request("f"), lambda out: None)
    assert engines[0].served[-1] == "f"
    front.abort("d")  # the replica that holds it ends it
    assert "d" not in engines[1].open and front.loads() == [2, 1]
    assert front.prompt_fits(10) and not front.prompt_fits(200)
    assert front.stats().max_context == 128 and front.stats().replicas == 2


def test_announced_requests_spread_before_they_reach_an_engine_and_unused_announcements_are_given_back():
    engines = [FakeEngine(), FakeEngine(), FakeEngine()]
    front = replicas.Replicas(engines)

    async def handler(rid: str, submits: bool):
        arrival = front.expect_request()  # the server announces, then reads the body
        await asyncio.sleep(0.01)
        if submits:
            async for _ in front.generate(_request(rid)):
                pass
        arrival.close()

    async def burst():
        await asyncio.gather(*(handler(rid, rid != "z") for rid in "xyz"))

    asyncio.run(burst())
    assert [e.served for e in engines] == [["x"], ["y"], []] and [e.announced for e in engines] == [1, 1, 1]
    assert front.loads() == [0, 0, 0]  # finished, and the announcement without a request given back


def test_the_device_split_and_the_default():
    assert replicas.split_devices(list(range(8)), 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    for bad in (0, -1, 3):
        with pytest.raises(ValueError, match="--data-parallel"):
            replicas.split_devices(list(range(8)), bad)
    gib = 1 << 30
    # a 1.5B bf16 (2 kv heads) on v5e-8: one replica per chip, and why
    n, why = replicas.default_data_parallel(2, 3 * gib, 8, "tpu", 16 * gib)
    assert n == 8 and "2 kv heads do not divide 8 chips" in why
    assert replicas.default_data_parallel(8, 3 * gib, 8, "tpu", 16 * gib)[0] == 1  # the heads divide
    assert replicas.default_data_parallel(2, 15 * gib, 8, "tpu", 16 * gib)[0] == 1  # too big for one chip
    assert replicas.default_data_parallel(2, 3 * gib, 4, "cpu", None)[0] == 1  # off TPU: 1


class FakeTpu:
    platform, device_kind = "tpu", "TPU v5 lite"


def test_the_plan_reads_the_config_and_picks_a_replica_per_v5e_chip_for_a_small_two_kv_head_model():
    configs = ROOT / "tests" / "data" / "tpu_configs"
    n, why = replicas.plan(configs / "qwen2.5-1.5b.json", None, [FakeTpu()] * 8, "bfloat16")
    assert n == 8 and "(2.88 GiB) fit one chip" in why
    assert replicas.plan(configs / "qwen3-8b.json", None, [FakeTpu()] * 8, "bfloat16")[0] == 1  # 8 kv heads divide
    assert replicas.plan(configs / "qwen3-8b.json", 2, [FakeTpu()] * 8, "bfloat16") == (2, "asked for")
    with pytest.raises(ValueError, match="does not divide the 8 devices"):
        replicas.plan(configs / "qwen3-8b.json", 3, [FakeTpu()] * 8, "bfloat16")


def test_data_parallel_2_on_4_devices_gives_one_devices_greedy_tokens(tmp_path):
    from tests.engine.helpers import byte_tokenizer
    from tests.models.conftest import build_tiny

    checkpoint = tmp_path / "tiny"
    build_tiny("qwen2", checkpoint, vocab_size=264, num_hidden_layers=1)  # 2 kv heads: one per device of a replica
    byte_tokenizer().save_pretrained(checkpoint)
    # the lowest XLA level (`compile_level`): this test is its 9 compiles; measured here, about half the time
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT), "JAXCHAT_FAST_COMPILE_BELOW": "10000000"}
    dest = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, str(HERE / "replicas_case.py"), str(checkpoint), str(dest)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(dest.read_text())
    assert out["meshes"] == [[0, 1], [2, 3]]
    assert out["two"] == out["one"] and all(len(ids) == 8 for ids in out["one"])
    assert all(n > 0 for n in out["generated"]) and out["loads_after"] == [0, 0]  # both replicas served rows
