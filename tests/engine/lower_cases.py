"""Run in a subprocess with 8 fake CPU devices by `test_lowering.py` (XLA_FLAGS must be set before jax starts):
`jaxchat lower` on the acceptance shapes, in this one process (`cli.main`, stdout captured), and the Pallas
kernel under shard_map on 2 devices against the same kernel on one (Pallas' TPU interpreter). Writes one JSON
file: {case: {"rc", "lines", "seconds"}, "shard_map": {...}}.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
from pathlib import Path

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "tpu_configs"

CASES = {
    # every program of the engine, the acceptance shape
    "qwen3-8b-v5e-4": ["qwen3-8b", "--chip", "v5e", "--devices", "4", "--max-batch", "64", "--max-context", "32768"],
    "qwen3-8b-v6e-8": ["qwen3-8b", "--chip", "v6e", "--devices", "8", "--max-batch", "64", "--max-context", "32768",
                       "--programs", "largest"],
    "qwen3-8b-v5e-1": ["qwen3-8b", "--chip", "v5e", "--devices", "1", "--programs", "largest"],
    "llama-70b-v5e-1": ["llama-70b", "--chip", "v5e", "--devices", "1"],
    "qwen3-moe-v6e-8": ["qwen3-moe-30b-a3b", "--chip", "v6e", "--devices", "8", "--programs", "largest"],
    "qwen3-8b-pallas-8-of-4-heads": ["qwen3-moe-30b-a3b", "--chip", "v5p", "--devices", "8", "--attention",
                                     "pallas", "--max-batch", "4", "--max-context", "2048", "--programs",
                                     "largest"],
    "head-dim-64-v5e-4": ["qwen2.5-0.5b", "--chip", "v5e", "--devices", "4", "--programs", "largest"],
    # 2 kv heads on 8 chips: 8 replicas of one chip, asked for and by default
    "qwen2.5-1.5b-dp8-v5e-8": ["qwen2.5-1.5b", "--chip", "v5e", "--devices", "8", "--data-parallel", "8",
                               "--max-batch", "8", "--max-context", "2048"],
    "qwen2.5-1.5b-v5e-8": ["qwen2.5-1.5b", "--chip", "v5e", "--devices", "8", "--max-batch", "8", "--max-context",
                           "2048", "--programs", "largest"],
}


def run_case(argv: list[str]) -> dict:
    from jaxchat.cli import main

    out = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out):
        rc = main(["lower", "--model", str(CONFIGS / f"{argv[0]}.json"), *argv[1:]])
    return {"rc": rc, "lines": out.getvalue().splitlines(), "seconds": time.perf_counter() - t0}


def shard_map_matches_one_device() -> dict:
    """The kernel backend on a 2-device mesh (heads split under shard_map) gives one device's outputs and pool."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxchat.engine import attention_tpu as at
    from jaxchat.engine.step import make_mesh
    from jaxchat.models.kv import StepInputs

    rng = np.random.default_rng(3)
    page, kvh, heads, dim, t = 16, 2, 4, 128, 16
    runs = [(1, 21), (9, 30), (1, 3)]  # (queries, context) per row
    tables = rng.permutation(np.arange(1, 10)).reshape(3, 3).astype(np.int32)
    pos = np.full(t, -1, np.int32)
    rows, cu, at_ = np.zeros(t, np.int32), [0], 0
    for r, (n, length) in enumerate(runs):
        pos[at_:at_ + n], rows[at_:at_ + n] = np.arange(length - n, length), r
        at_ += n
        cu.append(at_)
    safe = np.maximum(pos, 0)
    slots = np.where(pos >= 0, tables[rows, safe // page] * page + safe % page, -1).astype(np.int32)
    step = StepInputs(pos, rows, np.asarray(cu, np.int32), np.asarray([n for _, n in runs], np.int32), tables,
                      slots, np.arange(3, dtype=np.int32), np.asarray([3], np.int32))
    pool = jnp.asarray(rng.standard_normal((10, page, 2 * kvh, dim)), jnp.float32)
    q, k, v = (jnp.asarray(rng.standard_normal((t, h, dim)), jnp.float32) for h in (heads, kvh, kvh))
    outs = []
    for mesh in (None, make_mesh(jax.devices()[:2])):
        backend = at.PallasAttention(page, interpret=True, mesh=mesh)
        fn = jax.jit(lambda p, q, k, v, s, b=backend: b.begin(s).attend(p, None, q, k, v, scale=0.3))
        outs.append([np.asarray(x) for x in fn(pool, q, k, v, step)])
    (pool1, out1), (pool2, out2) = outs
    return {"out_max_diff": float(np.abs(out1 - out2).max()), "pool_max_diff": float(np.abs(pool1 - pool2).max()),
            "out_abs_max": float(np.abs(out1).max())}


def memory_on_four_devices() -> dict:
    """An engine on the kernel's path over 4 of the devices (no warm-up): the most bytes any device holds at each
    point of start-up (after each placement and each unstacked weight), against its share of the weights and
    the pool; whether any pool array is held whole by one device; the stacked weights left alive."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxchat.engine import engine as engine_mod
    from jaxchat.engine import step as step_mod
    from jaxchat.engine.engine import Engine
    from jaxchat.models import LoadedModel, ModelConfig
    from jaxchat.models.families import abstract_model, as_params

    cfg = ModelConfig(family="qwen3", vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=3,
                      num_heads=8, num_kv_heads=4, head_dim=128, qk_norm=True)
    graphdef, state = abstract_model(cfg, "float32")
    from flax import nnx

    shapes = as_params(nnx.to_pure_dict(state), cfg)
    params = jax.tree.map(lambda x: np.full(x.shape, 0.01, np.float32), shapes)
    model = LoadedModel(cfg, graphdef, params, "float32", tokenizer=None, eos_token_ids=())
    devices = jax.devices()[:4]
    peaks: list[int] = []

    def sample(*_):
        per: dict = {}
        for arr in jax.live_arrays():  # shard shapes by arithmetic: `shard.data` would add aliasing arrays
            shard = int(np.prod(arr.sharding.shard_shape(arr.shape))) * arr.dtype.itemsize
            for dev in arr.sharding.device_set:
                per[dev] = per.get(dev, 0) + shard
        peaks.append(max(per.values(), default=0))

    put, ready = jax.device_put, jax.block_until_ready

    def put_then_sample(*a, **k):
        out = put(*a, **k)
        ready(out)
        sample()
        return out

    def ready_then_sample(x):
        out = ready(x)
        sample()
        return out

    jax.device_put, jax.block_until_ready = put_then_sample, ready_then_sample
    # off TPU over several devices the engine takes the jnp path (the interpreter hangs there); no step runs
    # here, so the kernel's path is built as on a TPU slice
    choice, engine_mod.attention_choice = engine_mod.attention_choice, lambda *a, **k: ("pallas", None)
    try:
        engine = Engine(model, max_batch=4, max_context=256, mesh=step_mod.make_mesh(devices), num_pages=64,
                        page_size=16, step_token_buckets=(16,), decode_rows=(4,), attention="pallas",
                        warmup=False, start=False)
        sample()
    finally:
        jax.device_put, jax.block_until_ready = put, ready
        engine_mod.attention_choice = choice
    weights = sum(x.nbytes for x in jax.tree.leaves(params))
    pools = jax.tree.leaves(engine.runner.state.pools)
    pool = sum(x.nbytes for x in pools)
    largest_stacked = max(x.nbytes for x in jax.tree.leaves(params["layers"]))
    whole = [x.shape for x in pools if x.sharding.shard_shape(x.shape) == x.shape]
    stacked_alive = [a.shape for a in jax.live_arrays() if a.ndim and a.shape[0] == cfg.num_layers
                     and a.shape[1:] in {p.shape[1:] for p in jax.tree.leaves(params["layers"])}]
    engine.shutdown()
    return {"peaks": peaks, "weights": weights, "pool": pool, "largest_stacked": largest_stacked,
            "pools_whole_on_a_device": [list(s) for s in whole], "stacked_alive": [list(s) for s in stacked_alive],
            "backend": repr(engine.runner.backend) if engine.runner else "", "pool_dtype": str(jnp.float32)}


def main(dest: str) -> None:
    result = {name: run_case(argv) for name, argv in CASES.items()}
    t0 = time.perf_counter()
    result["shard_map"] = {**shard_map_matches_one_device(), "seconds": time.perf_counter() - t0}
    t0 = time.perf_counter()
    result["memory"] = {**memory_on_four_devices(), "seconds": time.perf_counter() - t0}
    Path(dest).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
