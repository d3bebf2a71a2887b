"""Run in a subprocess with 4 fake CPU devices by `test_replicas.py` (XLA_FLAGS must be set before jax starts):
the tiny checkpoint at argv[1] served by one engine on one device and by `--data-parallel 2` (two replicas of
two devices each, tensor-parallel), the same concurrent greedy requests to both. Writes one JSON file (argv[2]):
{"one": [token ids per request], "two": [...], "served": [requests each replica finished], "steps": [...]}.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

PROMPTS = [[5, 6, 7, 8, 9], [100, 3, 42], [7] * 12, [200, 201, 202, 203], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [33]]
SHAPES = {"dtype": "float32", "max_batch": 4, "max_context": 128, "decode_rows": (4,), "step_token_buckets": (64,),
          "warmup": False, "burst_gap_s": 0.0}


async def greedy(engine) -> list[list[int]]:
    from jaxchat.engine.types import GenerationRequest, SamplingParams

    async def one(prompt: list[int]) -> list[int]:
        out: list[int] = []
        request = GenerationRequest(prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
        async for delta in engine.generate(request):
            out += delta.token_ids
        return out

    return list(await asyncio.gather(*(one(p) for p in PROMPTS)))


def main(checkpoint: str, dest: str) -> None:
    import jax

    from jaxchat.engine import replicas
    from jaxchat.engine.step import make_mesh

    assert len(jax.devices()) == 4
    one = replicas.from_path(checkpoint, 1, mesh=make_mesh(jax.devices()[:1]), **SHAPES)
    try:
        single = asyncio.run(greedy(one))
    finally:
        one.shutdown()
    two = replicas.from_path(checkpoint, 2, **SHAPES)
    try:
        assert isinstance(two, replicas.Replicas)
        meshes = [[d.id for d in e.mesh.devices.flat] for e in two.engines]
        parallel = asyncio.run(greedy(two))
        served = [e.stats().generated_tokens for e in two.engines]
        loads = two.loads()
    finally:
        two.shutdown()
    Path(dest).write_text(json.dumps({"one": single, "two": parallel, "generated": served, "meshes": meshes,
                                      "loads_after": loads}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
