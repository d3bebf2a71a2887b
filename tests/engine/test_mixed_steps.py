"""Mixed steps: a prompt that arrives while other rows decode is prefilled in chunks inside their decode steps.

- The forward over [decode tokens | prompt chunk] gives the logits and cache that a decode call then a prefill
  call give (stacked and unrolled layouts; a family with attention sinks and sliding windows too).
- Greedy outputs are identical with mixed steps and with separate prefills, over arrival schedules, prompt
  lengths (one or several chunks) and output lengths (hypothesis), prefix reuse on.
- A running row gets a token at every step while an arrival's prompt is chunked in beside it.
- Several arrivals' chunks ride in one step (a burst is not staggered one per step), also when a decoding row
  lies between their rows, with penalties on (the rows' counts are kept right)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxchat.engine.engine import Engine
from jaxchat.engine.types import GenerationRequest, SamplingParams
from tests.engine.helpers import tiny_byte_qwen2

CHUNK = 8  # prompt tokens per mixed step: the test prompts take one to five chunks


@pytest.mark.parametrize("family", ["qwen2", "gpt_oss"])
def test_mixed_forward_equals_decode_then_prefill(family, tmp_path):
    import jax

    from jaxchat.models.load import load_model
    from tests.models.conftest import build_tiny

    build_tiny(family, tmp_path)
    model = load_model(tmp_path, "float32")
    assert model.mixed_steps
    rng = np.random.default_rng(0)
    b, c, n = 4, 8, 6
    for platform in ("cpu", "tpu"):  # the unrolled layout, then the stacked one (the layout is all that differs)
        sm = model.step_model(model.params, platform)
        forward = jax.jit(sm.forward, static_argnames=("mixed",))
        cache_k, cache_v = sm.new_cache(b, 64, (32, 64))
        history = np.array([5, 9, 4, 3])  # row 2 is the arriving prompt's row: 4 tokens in, n more in the chunk
        toks = rng.integers(0, 200, (b, 9)).astype(np.int32)
        positions = np.where(np.arange(9) < history[:, None], np.arange(9), -1).astype(np.int32)
        _, cache_k, cache_v = forward(sm.params, toks, positions, cache_k, cache_v)
        dec_tokens = rng.integers(0, 200, b).astype(np.int32)
        dec_positions = np.array([5, 9, -1, 3], np.int32)
        chunk = rng.integers(0, 200, c).astype(np.int32)
        chunk_positions = np.full(c, -1, np.int32)
        chunk_positions[:n] = np.arange(4, 4 + n)
        want_dec, ck, cv = forward(sm.params, dec_tokens[:, None], dec_positions[:, None], cache_k, cache_v)
        want_chunk, ck, cv = forward(sm.params, chunk[None], chunk_positions[None], ck, cv, row_offset=2,
                                        logits_index=np.array([n - 1], np.int32))
        got, gk, gv = forward(sm.params, np.concatenate([dec_tokens, chunk])[None],
                                 np.concatenate([dec_positions, chunk_positions])[None], cache_k, cache_v,
                                 row_offset=2, logits_index=np.array([[0, 1, 2, 3, b + n - 1]], np.int32),
                                 mixed=(b, 1, c))
        got = np.asarray(got)[0]
        live = [0, 1, 3]  # row 2's decode token is padding
        np.testing.assert_allclose(got[live], np.asarray(want_dec)[live, 0], atol=2e-5, rtol=1e-4)
        np.testing.assert_allclose(got[b], np.asarray(want_chunk)[0, 0], atol=2e-5, rtol=1e-4)
        for x, y in zip(jax.tree.leaves((ck, cv)), jax.tree.leaves((gk, gv)), strict=True):
            np.testing.assert_allclose(np.asarray(y), np.asarray(x), atol=2e-5, rtol=1e-4)


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """A tiny Qwen2 twice: mixed steps of CHUNK tokens, and every prompt in a prefill program of its own."""
    model = tiny_byte_qwen2(tmp_path_factory.mktemp("tiny_qwen2"))
    shapes = {"max_batch": 4, "max_context": 128, "length_buckets": (32, 128), "warmup": False, "start": False}
    mixed = Engine(model, **shapes, prefill_chunk=CHUNK)
    separate = Engine(model, **shapes, prefill_chunk=0)
    assert mixed.runner.prefill_chunk == CHUNK and separate.runner.prefill_chunk == 0
    yield mixed, separate
    mixed.shutdown()
    separate.shutdown()


def run_schedule(engine, requests, frequency_penalty: float = 0.0):
    """requests: (prompt, max_tokens, step it arrives at). Steps the scheduler by hand until all are done;
    returns ({request id: output ids}, {request id: [step of each output delta]})."""
    sched = engine.scheduler
    outs: dict[str, list[int]] = {}
    when: dict[str, list[int]] = {}
    pending = sorted(enumerate(requests), key=lambda r: r[1][2])
    step = 0

    def emit_for(rid):
        def emit(out):
            outs.setdefault(rid, []).extend(out.token_ids)
            when.setdefault(rid, []).append(step)
        return emit

    while pending or sched.has_work():
        while pending and pending[0][1][2] <= step:
            i, (prompt, max_tokens, _) = pending.pop(0)
            sampling = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True,
                                      frequency_penalty=frequency_penalty)
            sched.submit(GenerationRequest(list(prompt), sampling, request_id=f"r{i}"), emit_for(f"r{i}"))
        sched.step()
        step += 1
        assert step < 500
    return outs, when


request = st.tuples(st.lists(st.integers(0, 255), min_size=1, max_size=40), st.integers(1, 10), st.integers(0, 12))


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(request, min_size=2, max_size=6))
def test_greedy_outputs_equal_separate_prefills(engines, requests):
    mixed, separate = engines
    want, _ = run_schedule(separate, requests)
    got, _ = run_schedule(mixed, requests)
    assert got == want
    assert all(len(got[f"r{i}"]) == r[1] for i, r in enumerate(requests))


def test_running_rows_decode_at_every_step_while_a_prompt_is_chunked_in(engines):
    mixed, _ = engines
    before = mixed.scheduler.mixed_steps
    long_prompt = list(range(30, 63))  # 33 tokens: 5 chunks of 8
    outs, when = run_schedule(mixed, [([1, 2, 3], 20, 0), (long_prompt, 3, 4)])
    assert len(outs["r0"]) == 20 and len(outs["r1"]) == 3
    assert mixed.scheduler.mixed_steps - before == 5
    # r0 got a token at every step from its first to its last (its prefill and first decode share step 0; no
    # step went to the arrival's prompt alone), and the arrival's first token came with its fifth chunk, at
    # step 4 + 4
    assert when["r0"] == [0, *range(20 - 1)]
    assert when["r1"][0] == 8


def test_a_burst_of_arrivals_rides_in_one_mixed_step(engines):
    mixed, separate = engines
    requests = [([1, 2, 3], 12, 0), ([40, 41], 4, 2), ([50], 4, 2), ([60, 61], 4, 2)]
    want, _ = run_schedule(separate, requests, frequency_penalty=0.7)
    before = mixed.scheduler.mixed_steps
    got, when = run_schedule(mixed, requests, frequency_penalty=0.7)
    assert got == want
    assert mixed.scheduler.mixed_steps - before == 1  # all three prompts in one step of [4 rows x 2 tokens]
    assert when["r1"][0] == when["r2"][0] == when["r3"][0] == 2


def test_chunk_rows_around_a_decoding_row_share_a_step_and_keep_its_counts(engines):
    """r1's long prompt is chunked from step 2; r2 (row 2) ends its one-token prompt beside it and decodes;
    r3 (row 3) arrives at step 4 and rides in the same [4 x 2] step as r1's chunk, with r2's row in between
    (padding in the chunk part: its counts, which the frequency penalty reads, must survive)."""
    mixed, separate = engines
    long_prompt = list(range(100, 133))
    requests = [([1, 2, 3], 16, 0), (long_prompt, 5, 2), ([7], 10, 2), ([9, 10], 5, 4)]
    want, _ = run_schedule(separate, requests, frequency_penalty=0.7)
    got, when = run_schedule(mixed, requests, frequency_penalty=0.7)
    assert got == want
    assert when["r2"][0] == 2 and when["r3"][0] == 4


def test_mixed_steps_are_on_by_default_on_accelerators_only():
    """XLA:CPU's matmuls are compute-bound at these row counts (a chunk beside the decode rows costs about what
    its own prefill does), so the default is off there; on TPU/GPU decode is bandwidth-bound and it is on."""
    from types import SimpleNamespace

    from jaxchat.engine.engine import DEFAULT_PREFILL_CHUNK, default_prefill_chunk
    from jaxchat.engine.step import make_mesh

    tpu = SimpleNamespace(devices=np.array([SimpleNamespace(platform="tpu")] * 4))
    assert default_prefill_chunk(tpu) == DEFAULT_PREFILL_CHUNK > 0
    assert default_prefill_chunk(make_mesh()) == 0  # this machine's CPU devices


def test_models_with_recurrent_layers_never_mix(tmp_path):
    """LFM2's convolution window advances one row's tokens in order: the runner keeps mixed steps off for it
    whatever the engine asks."""
    from jaxchat.models.load import load_model
    from tests.models.conftest import build_tiny

    build_tiny("lfm2", tmp_path)
    model = load_model(tmp_path, "float32")
    assert not model.mixed_steps
    e = Engine(model, max_batch=2, max_context=32, length_buckets=(16, 32), prefill_chunk=8, warmup=False,
               start=False)
    assert e.runner.prefill_chunk == 0 and not e.runner.mixed_buckets
