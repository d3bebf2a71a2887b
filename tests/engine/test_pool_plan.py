"""The KV pool planned per device from the device's own memory figures (`engine/pool_plan.py`, issue 48 item 3).

XLA:CPU reports no device memory, so these tests hand the engine the figures a TPU or GPU would report
(`pool_plan.device_memory`); everything else is the real path: the probe runner, the compiled programs' memory
analysis, the plan, the pool the runner allocates."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxchat.engine import pool_plan, slice_plan
from jaxchat.engine.attention_xla import XlaAttention
from jaxchat.engine.engine import Engine
from jaxchat.engine.step import StepRunner, make_mesh
from jaxchat.engine.types import GenerationRequest, SamplingParams
from tests.engine.helpers import FakeConfig, FakeModel, byte_tokenizer

MIB = 1 << 20
# few, small programs: the probe compiles the largest of each kind, a request compiles what it runs
SHAPES = dict(max_batch=4, max_context=64, start=False, warmup=False, step_token_buckets=(16,), decode_rows=(4,))


def _engine(monkeypatch, limit: int, in_use: int, **kw) -> Engine:
    monkeypatch.setattr(pool_plan, "device_memory", lambda mesh: pool_plan.DeviceMemory(limit, in_use))
    return Engine(FakeModel(byte_tokenizer(), eos=(256,)), **{**SHAPES, **kw})


def _probe(model: FakeModel, pages: int) -> StepRunner:
    mesh = make_mesh()
    return StepRunner(model.step_model(model.params, "cpu"), max_batch=4, max_context=64, vocab_size=320,
                      valid_vocab=320, mesh=mesh, backend=XlaAttention(16), num_pages=pages, token_buckets=(16, 64),
                      decode_rows=(1, 4), ragged_rows=(4,), abstract_arrays=True)


def test_the_steps_temporaries_are_read_from_the_compiled_programs_and_do_not_depend_on_the_pools_size():
    model = FakeModel(byte_tokenizer(), eos=(256,))
    small, large = _probe(model, 5), _probe(model, 401)
    measured = pool_plan.step_temporaries(small)
    assert measured == pool_plan.step_temporaries(large) and measured > 0


def test_the_pool_takes_what_the_device_has_left_after_weights_state_temporaries_and_headroom(monkeypatch):
    limit, in_use = 64 * MIB, 40 * MIB
    engine = _engine(monkeypatch, limit, in_use, max_batch=64, max_context=4096, decode_rows=(64,))
    runner = engine.runner
    assert engine.pool_memory["temporaries_how"] == "measured"
    temporaries = engine.pool_memory["temporaries"]
    assert temporaries == pool_plan.step_temporaries(runner)  # the probe measured what the real programs take
    pool = slice_plan.chip_bytes(runner.state.pools, padded=False)
    state = 5 * 64 * 320  # the sampler's counts (int32) and prompt mask (bool), one row per slot
    left = limit * (1 - slice_plan.HEADROOM) - in_use - state - temporaries
    page = pool / runner.num_pages
    assert pool <= left < pool + 2 * page  # all of what is left, to a page (the page count stays even)
    assert runner.num_pages < 64 * 4096 // 16  # memory, not rows x context, set the size
    engine.shutdown()


def test_a_device_too_small_for_one_row_is_refused_with_what_would_fit(monkeypatch):
    # 256 bytes of pool a token: a row of 2^17 tokens takes 32 MiB; the message says what is over, by how much
    with pytest.raises(ValueError, match=r"does not fit .* step temporaries [\d.]+ GiB, one row of 131072 tokens "
                                         r"0\.03 GiB per chip: [\d.]+ GiB over"):
        _engine(monkeypatch, 64 * MIB, 40 * MIB, max_context=1 << 17)
    gib = 1 << 30
    fit = pool_plan.plan_pool(pool_plan.DeviceMemory(8 * gib, 6 * gib), temporaries=3 * gib, state=0, per_page=4096,
                              fixed=0, page_size=16, max_batch=4, max_context=64, devices=1, device_name="TPU v5 lite")
    assert not fit.fits and fit.pages == 0 and "step temporaries 3.00 GiB" in fit.message  # the temporaries alone
    assert "--devices" not in fit.message  # `jaxchat lower`'s flag, not the server's
    fit = pool_plan.plan_pool(pool_plan.DeviceMemory(8 * gib, 1 * gib), temporaries=MIB, state=0, per_page=MIB,
                              fixed=0, page_size=16, max_batch=4, max_context=4096, devices=1, device_name="TPU v5 lite",
                              kv_cache_gib=0.1)  # 102 pages where one row needs 257: the flag is too small
    assert not fit.fits and fit.message.startswith("--kv-cache-gib 0.1 holds 102 pages of 16 tokens per chip; one row "
                                                   "of 4096 tokens needs 257: give more --kv-cache-gib")
    with pytest.raises(ValueError, match="kv_cache_gib must be positive"):
        _engine(monkeypatch, 64 * MIB, 8 * MIB, kv_cache_gib=0)


def test_kv_cache_gib_is_per_device_and_greedy_tokens_equal_the_cpu_sized_pool(monkeypatch):
    planned = _engine(monkeypatch, 1 << 34, 8 * MIB, kv_cache_gib=1 / 1024)  # 1 MiB of pages per device
    per_page = slice_plan.chip_bytes(planned.runner.state.pools, padded=False) / planned.runner.num_pages
    assert abs(planned.runner.num_pages * per_page - MIB) <= 2 * per_page
    monkeypatch.undo()
    plain = Engine(FakeModel(byte_tokenizer(), eos=(256,)), **SHAPES)
    assert plain.pool_memory is None and plain.runner.num_pages != planned.runner.num_pages

    def greedy(engine: Engine) -> list[int]:
        out: list = []
        engine.scheduler.submit(GenerationRequest(list(b"the plan"), SamplingParams(max_tokens=12, ignore_eos=True),
                                                  None, "r"), out.append)
        while engine.core.has_work():
            engine.core.step()
        engine.shutdown()
        return [t for o in out for t in o.token_ids]

    assert greedy(planned) == greedy(plain)


def test_a_tpu_pool_of_head_dim_64_counts_128_lanes():
    """The jnp path's pool at a TPU page of 128 tokens: keys [pages, kv, 64, 128] fill their lanes, values
    [pages, kv, 128, 64] take 128 lanes for 64 numbers, so a page costs 1.5x its plain bytes in HBM."""
    model = FakeModel(config=FakeConfig(head_dim=64, hidden_size=128))
    backend = XlaAttention(128)

    def new(n):
        return model.new_pools(backend, n, 128, 4)

    mesh = make_mesh(jax.devices()[:1])
    plain, _ = pool_plan.page_bytes(new, mesh, False, backend.pool_head_axis, padded=False)
    padded, _ = pool_plan.page_bytes(new, mesh, False, backend.pool_head_axis, padded=True)
    half = 128 * 2 * 64 * np.dtype("float32").itemsize  # the keys' (or the values') bytes of a page
    assert plain == 2 * half and padded == half + 2 * half
