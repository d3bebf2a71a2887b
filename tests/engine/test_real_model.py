"""The engine on real model code: a tiny random Qwen2 checkpoint (transformers `save_pretrained` ->
`load_model`), a tiny random Qwen3-MoE one through `jaxchat.LLM`, sharded over 8 fake CPU devices, and one slow test on SmolLM2-135M from its GGUF."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from jaxchat.engine.types import GenerationRequest, SamplingParams
from tests.engine.helpers import byte_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def make_checkpoint(path: Path, heads: int = 8, kv_heads: int = 8) -> Path:
    import torch
    import transformers

    cfg = transformers.Qwen2Config(vocab_size=264, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=heads, num_key_value_heads=kv_heads,
                                   max_position_embeddings=256, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(cfg).eval()
    model.save_pretrained(path)
    byte_tokenizer().save_pretrained(path)
    return path


def run_plan(engine, plan):
    """Drive the scheduler by hand; plan = {step: [("submit", req) | ("abort", id)]}; returns {id: token ids}."""
    got: dict[str, list] = {}
    step, sched = 0, engine.scheduler
    while engine.core.has_work() or any(k >= step for k in plan):
        for action, arg in plan.get(step, []):
            if action == "submit":
                got[arg.request_id] = []
                sched.submit(arg, got[arg.request_id].append)
            else:
                sched.abort(arg)
        engine.core.step()
        step += 1
    return {k: [t for o in v for t in o.token_ids] for k, v in got.items()}


def greedy(rid, prompt, n):
    return GenerationRequest(list(prompt), SamplingParams(max_tokens=n, ignore_eos=True), None, rid)


def isolation_plan(prompt, n):
    return {
        0: [("submit", greedy("a", [5, 6, 7], 4)), ("submit", greedy("b", range(20, 45), 30))],
        2: [("submit", greedy("p", prompt, n))],
        4: [("submit", greedy("c", [9] * 11, 6))],
        6: [("abort", "b"), ("submit", greedy("d", [3, 1, 4, 1, 5], 12))],
    }


def test_tiny_qwen2_isolation_and_transformers_parity(tmp_path):
    from jaxchat.engine.engine import Engine
    from jaxchat.models import load_model

    ckpt = make_checkpoint(tmp_path / "ckpt")
    prompt = [11, 12, 13, 14, 15, 16, 17]
    # alone in the 1-row decode program, joined by others in the 4-row one (CI time: 5 programs, not 8)
    engine = Engine(load_model(ckpt, "float32", None), max_batch=4, max_context=32, start=False,
                    step_token_buckets=(64,), decode_rows=(1, 4))
    alone = run_plan(engine, {0: [("submit", greedy("p", prompt, 20))]})["p"]
    mixed = run_plan(engine, isolation_plan(prompt, 20))
    assert mixed["p"] == alone
    assert alone == transformers_greedy(ckpt, prompt, 20)
    assert engine.stats().compiles_on_request_path == 0


def transformers_greedy(ckpt: Path, prompt: list[int], n: int, suppress=(263,)) -> list[int]:
    """transformers' greedy continuation (token 263 is past the byte tokenizer's vocabulary: never sampled)."""
    import torch
    import transformers

    ref = transformers.AutoModelForCausalLM.from_pretrained(ckpt).eval()
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, suppress_tokens=list(suppress))
    return out[0, len(prompt):].tolist()


def test_tiny_qwen3_moe_llm_continuous_batching_and_transformers_parity(tmp_path):
    """A routed-experts model through `jaxchat.LLM(...).generate`: 32 greedy tokens of a prompt alone equal
    the same prompt's while 3 other requests join it (continuous batching), and transformers'."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import jaxchat
    from tests.models.conftest import build_tiny

    ckpt = tmp_path / "moe"
    build_tiny("qwen3_moe", ckpt, vocab_size=264, num_hidden_layers=2)
    byte_tokenizer().save_pretrained(ckpt)
    prompt = [11, 12, 13, 14, 15, 16, 17]
    llm = jaxchat.LLM(model=str(ckpt), max_batch=4, max_context=64, warmup=False, constrained=False)  # no eos
    try:
        alone = llm.generate(prompt, max_tokens=32, ignore_eos=True).token_ids
        engine = llm.service.engine
        steps = engine.stats().steps
        with ThreadPoolExecutor(4) as pool:
            mine = pool.submit(llm.generate, prompt, max_tokens=32, ignore_eos=True)
            others = []
            for other, n in (([5, 6, 7], 12), (list(range(20, 45)), 20), ([9] * 11, 6)):
                time.sleep(0.05)  # join while the first request decodes
                others.append(pool.submit(llm.generate, other, max_tokens=n, ignore_eos=True))
            mixed = mine.result().token_ids
            assert [len(o.result().token_ids) for o in others] == [12, 20, 6]
        assert engine.stats().steps - steps < 32 + 12 + 20 + 6  # the requests shared steps
    finally:
        llm.close()
    assert len(alone) == 32 and mixed == alone
    assert alone == transformers_greedy(ckpt, prompt, 32)


SHARDED = textwrap.dedent("""
    import json, sys
    import jax
    from jaxchat.engine.engine import Engine
    from jaxchat.engine.step import make_mesh
    from jaxchat.models import load_model
    from tests.engine.test_real_model import isolation_plan, run_plan
    assert len(jax.devices()) == 8, jax.devices()
    out = {}
    for name, devs in (("one", jax.devices()[:1]), ("eight", jax.devices())):
        mesh = make_mesh(devs)
        e = Engine(load_model(sys.argv[1], "float32", None), max_batch=4, max_context=32, mesh=mesh, start=False,
                   step_token_buckets=(64,), decode_rows=(4,))  # 3 programs a mesh (CI time)
        out[name] = run_plan(e, isolation_plan([11, 12, 13, 14, 15], 12))
        keys = jax.tree.leaves(e.runner.state.pools)[0]
        out[name + "_pool_shape"] = list(keys.shape)
        out[name + "_shard_shape"] = list(keys.addressable_shards[0].data.shape)
        out[name + "_shards"] = len({s.device for s in keys.addressable_shards})
    print(json.dumps(out))
""")


@pytest.mark.parametrize("kv_heads", [8, 2])
def test_sharded_over_8_cpu_devices_equals_unsharded(tmp_path, kv_heads):
    """8 kv heads: the pool splits over its kv heads; 2 kv heads (fewer than the devices): over its pages, each
    device holding 1/8 of them. Either way the outputs are one device's."""
    ckpt = make_checkpoint(tmp_path / "ckpt", kv_heads=kv_heads)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", SHARDED, str(ckpt)], check=False, env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["one"] == out["eight"]
    pages, shard = out["eight_pool_shape"], out["eight_shard_shape"]
    if kv_heads == 8:
        assert shard[1] * 8 == pages[1] == kv_heads and shard[0] == pages[0]
    else:
        assert shard[0] * 8 == pages[0] and shard[1] == pages[1] == kv_heads
    assert out["eight_shards"] == 8


@pytest.mark.slow
def test_smollm2_gguf_batch_isolation():
    from jaxchat.assets import AssetError, asset_path
    from jaxchat.engine.engine import Engine
    from jaxchat.models import load_model

    try:
        path = asset_path("smollm2-135m-instruct-q4_1.gguf")
    except AssetError as e:
        pytest.skip(str(e))
    model = load_model(path, "float32", None)
    text = model.tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours."}],
                                               add_generation_prompt=True, tokenize=False)
    prompt = model.tokenizer.encode(text, add_special_tokens=False)
    # alone in the 1-row program, joined by 3 others in the 4-row one (CI time: few programs)
    engine = Engine(model, max_batch=4, max_context=128, start=False, step_token_buckets=(64,), decode_rows=(1, 4))
    alone = run_plan(engine, {0: [("submit", greedy("p", prompt, 16))]})["p"]
    mixed = run_plan(engine, isolation_plan(prompt, 16))
    assert mixed["p"] == alone
    assert engine.stats().compiles_on_request_path == 0
