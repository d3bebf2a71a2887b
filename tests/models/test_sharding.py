"""Tensor parallelism over 8 fake CPU devices gives the same logits as one device.

The check runs in a subprocess because XLA_FLAGS must be set before jax is imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from .conftest import build_tiny

SCRIPT = textwrap.dedent("""
    import sys
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from jaxchat.models import load_model, save_orbax
    from tests.models.paged import PagedRows
    assert jax.device_count() == 8, jax.devices()
    src, out = sys.argv[1], sys.argv[2]
    mesh = Mesh(np.array(jax.devices()).reshape(8), ("tp",))
    ref = load_model(src)
    sharded = load_model(src, mesh=mesh)
    specs = sharded.partition_specs(mesh)
    assert specs["layers"]["attn"]["o"] == P(None, "tp", None, None), specs["layers"]["attn"]["o"]
    assert specs["layers"]["attn"]["qkv"] == P(None, None, None, None, None)  # 2 kv heads: replicated
    assert specs["layers"]["mlp"]["down"] == P(None, None, "tp")
    assert sharded.params["layers"]["attn"]["o"].sharding.spec == specs["layers"]["attn"]["o"]
    restored = load_model(save_orbax(sharded, out), mesh=mesh)
    assert restored.params["layers"]["mlp"]["gate_up"].sharding == NamedSharding(mesh, specs["layers"]["mlp"]["gate_up"])

    def greedy(model, mesh=None):
        rows = PagedRows(model, 2, 32)
        if mesh is not None:  # the pools on the mesh as the engine places them: 2 kv heads on 8 devices, the pages
            rows.place(mesh)
            assert all(x.sharding.spec == P(None, "tp", None, None, None) for x in jax.tree.leaves(rows.pools)), rows.pools
        first = rows(np.arange(20).reshape(2, 10) * 13 % 256, np.tile(np.arange(10), (2, 1)))
        out = [first[:, -1].argmax(-1)]
        for t in range(10, 18):
            out.append(rows(out[-1][:, None], np.full((2, 1), t))[:, -1].argmax(-1))
        if mesh is not None:  # the forward keeps the pools on the mesh
            assert all(len(x.sharding.device_set) == 8 for x in jax.tree.leaves(rows.pools)), rows.pools
        return first, np.stack(out, 1)

    a_logits, a_tokens = greedy(ref)
    for m in (sharded, restored):
        b_logits, b_tokens = greedy(m, mesh)
        diff = np.abs(a_logits - b_logits).max()
        assert diff <= 1e-4, diff
        np.testing.assert_array_equal(a_tokens, b_tokens)
    print("SHARDING-OK", diff)
""")


def test_tensor_parallel_matches_single_device(tmp_path):
    ckpt = tmp_path / "tiny"
    build_tiny("qwen2", ckpt, num_attention_heads=8, num_key_value_heads=2, head_dim=8, intermediate_size=128)
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, str(script), str(ckpt), str(tmp_path / "orbax")], env=env, check=False,
                          capture_output=True, text=True, timeout=600, cwd=root)
    assert proc.returncode == 0 and "SHARDING-OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_experts_axis_goes_to_ep_else_tp():
    """Routed experts' params shard their "experts" axis over 'ep' when the mesh has one (and 'tp' then splits
    "mlp"), else over 'tp'; a non-dividing expert count is replicated."""
    from types import SimpleNamespace

    from jax.sharding import PartitionSpec as P

    from jaxchat.models.sharding import spec_for

    axes, shape = ("experts", "embed", "mlp"), (8, 64, 64)
    assert spec_for(axes, shape, SimpleNamespace(shape={"tp": 2})) == P("tp", None, None)
    assert spec_for(axes, shape, SimpleNamespace(shape={"ep": 4, "tp": 2})) == P("ep", None, "tp")
    assert spec_for(axes, (6, 64, 64), SimpleNamespace(shape={"ep": 4})) == P(None, None, None)
    assert spec_for(("router", "embed"), (8, 64), SimpleNamespace(shape={"tp": 2})) == P(None, None)


EXPERTS_SCRIPT = textwrap.dedent("""
    import sys
    import jax, numpy as np
    from jax.sharding import Mesh, PartitionSpec as P
    from jaxchat.models import load_model
    from tests.models.paged import PagedRows
    ref = load_model(sys.argv[1])
    # 2 x 40 tokens x top-4 = 320 routed rows: the grouped (ragged_dot) expert path
    ids = np.random.default_rng(0).integers(0, 256, (2, 40))
    pos = np.broadcast_to(np.arange(40), (2, 40))
    want = PagedRows(ref, 2, 48)(ids, pos)
    for shape, names, spec in (((8,), ("tp",), P(None, "tp", None, None)),
                               ((4, 2), ("ep", "tp"), P(None, "ep", None, "tp"))):
        mesh = Mesh(np.array(jax.devices()).reshape(shape), names)
        m = load_model(sys.argv[1], mesh=mesh)
        assert m.params["layers"]["experts"]["gate_up"].sharding.spec == spec
        rows = PagedRows(m, 2, 48)
        if names == ("tp",):  # the engine's mesh: its pools as it places them (no engine runs on the 2-D mesh)
            rows.place(mesh)
        diff = np.abs(rows(ids, pos) - want).max()
        assert diff <= 1e-4, (names, diff)
    # the engine (continuous batching, its own ("tp",) mesh: experts over all 8 devices): greedy tokens of
    # requests joining and leaving equal one device's
    from jaxchat.engine.engine import Engine
    from jaxchat.engine.step import make_mesh
    from tests.engine.test_real_model import isolation_plan, run_plan
    out = {}
    for name, devs in (("one", jax.devices()[:1]), ("eight", jax.devices())):
        e = Engine(load_model(sys.argv[1]), max_batch=4, max_context=48, mesh=make_mesh(devs), start=False,
                   step_token_buckets=(32,), decode_rows=(4,), warmup=False)  # 3 programs a mesh (CI time)
        out[name] = run_plan(e, isolation_plan([11, 12, 13, 14, 15, 16, 17, 18, 19, 20], 30))
    spec = e.runner.params["layers"][0]["experts"]["gate_up"].sharding.spec  # the eight devices' engine
    assert out["one"] == out["eight"] and len(out["one"]["p"]) == 30, out
    assert spec[0] == "tp", spec
    print("EXPERTS-OK")
""")


def test_expert_parallel_gpt_oss_matches_single_device(tmp_path):
    """The tiny gpt_oss sharded over 8 fake CPU devices, experts over 'tp' alone and over 'ep' (with 'tp' on
    their hidden units), gives the single device's logits; through the engine, the same greedy tokens."""
    ckpt = tmp_path / "tiny"
    build_tiny("gpt_oss", ckpt)
    script = tmp_path / "run.py"
    script.write_text(EXPERTS_SCRIPT)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, str(script), str(ckpt)], env=env, check=False,
                          capture_output=True, text=True, timeout=600, cwd=root)
    assert proc.returncode == 0 and "EXPERTS-OK" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
