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


def main(dest: str) -> None:
    result = {name: run_case(argv) for name, argv in CASES.items()}
    t0 = time.perf_counter()
    result["shard_map"] = {**shard_map_matches_one_device(), "seconds": time.perf_counter() - t0}
    Path(dest).write_text(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
