"""An engine warm-up on a 2-layer random-weight model: the check `tpu_setup.sh` runs after the kernel check (the
engine builds its pool, compiles its programs and generates on these chips, not only jax and one kernel call).

Contract:
- `smoke_config(devices)`: a tiny Qwen3-shaped `ModelConfig` (2 layers, head_dim 128, vocabulary 1,024) whose
  kv heads are as many as `devices` (one a device, with two query heads: a share the Pallas kernel tiles), so
  that on TPU `--attention auto` picks the kernel under shard_map as it would for Qwen3-8B.
- `random_model(config, dtype)`: a `LoadedModel` of `config` with normal(0, 0.02) weights, seed 0 (no tokenizer).
- `engine_warmup(devices=None, attention="auto", new_tokens=8) -> SmokeResult`: an `Engine` over `devices`
  (default: this process's local devices) in bfloat16 on accelerators, float32 on CPU, with few programs
  (one row, one 64-token step bucket, a 256-token context: three programs), then one greedy generation of
  `new_tokens` tokens.
  `SmokeResult.ok`: as many tokens as asked, every id in the vocabulary, and no compile after the warm-up;
  `SmokeResult.line()` says so in one line. On CPU it takes a few seconds (the jnp path).
- `python -m jaxchat.engine.smoke [--attention auto|xla|pallas] [--new-tokens N]`: runs it, prints the line;
  exit 0 when ok, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax

PROMPT = [11, 22, 33, 44, 55, 66, 77]


def smoke_config(devices: int):
    from jaxchat.models import ModelConfig

    kv = devices  # one kv head and two query heads a device: a share the kernel tiles
    return ModelConfig(family="qwen3", vocab_size=1024, hidden_size=256, intermediate_size=512, num_layers=2,
                       num_heads=2 * kv, num_kv_heads=kv, head_dim=128, rope_theta=1e6, qk_norm=True,
                       tie_word_embeddings=True, max_position_embeddings=4096)


def random_model(config: Any, dtype: str, source: str = "random:smoke"):
    from flax import nnx

    from jaxchat.models import LoadedModel
    from jaxchat.models.families import abstract_model, as_params

    graphdef, state = abstract_model(config, dtype)
    shapes = as_params(nnx.to_pure_dict(state), config)
    leaves, tree = jax.tree.flatten(shapes)
    keys = jax.random.split(jax.random.key(0), len(leaves))
    params = jax.tree.unflatten(tree, [(jax.random.normal(k, x.shape, jax.numpy.float32) * 0.02).astype(x.dtype)
                                       for k, x in zip(keys, leaves, strict=True)])
    return LoadedModel(config, graphdef, params, dtype, tokenizer=None, eos_token_ids=(), source=source)


@dataclasses.dataclass
class SmokeResult:
    devices: int
    platform: str
    attention: str
    programs: int
    ready_s: float
    tokens: list[int]
    new_tokens: int
    vocab_size: int
    compiles_after_warmup: int

    @property
    def ok(self) -> bool:
        return (len(self.tokens) == self.new_tokens and all(0 <= t < self.vocab_size for t in self.tokens)
                and self.compiles_after_warmup == 0)

    def line(self) -> str:
        head = (f"engine warm-up on {self.devices} {self.platform} device(s), 2-layer random model, attention "
                f"{self.attention}: {self.programs} programs ready in {self.ready_s:.1f} s, "
                f"greedy tokens {self.tokens}")
        if self.ok:
            return head + ": ok"
        return head + (f": FAILED (wanted {self.new_tokens} tokens below {self.vocab_size}, "
                       f"{self.compiles_after_warmup} compiles after the warm-up)")


def engine_warmup(devices: Sequence[Any] | None = None, attention: str = "auto", new_tokens: int = 8) -> SmokeResult:
    from jaxchat.engine.engine import Engine
    from jaxchat.engine.step import make_mesh
    from jaxchat.engine.types import GenerationRequest, SamplingParams

    devices = list(devices or jax.local_devices())
    platform = devices[0].platform
    config = smoke_config(len(devices))
    model = random_model(config, "float32" if platform == "cpu" else "bfloat16")
    t0 = time.perf_counter()
    engine = Engine(model, max_batch=1, max_context=256, mesh=make_mesh(devices), step_token_buckets=(64,),
                    attention=attention, prefix_cache=False, burst_gap_s=0, programs="all", speculative="off")
    ready = time.perf_counter() - t0
    try:
        async def generate() -> list[int]:
            out: list[int] = []
            request = GenerationRequest(list(PROMPT), SamplingParams(max_tokens=new_tokens, ignore_eos=True))
            async for delta in engine.generate(request):
                out += delta.token_ids
            return out

        tokens = asyncio.run(generate())
        stats = engine.stats()
        return SmokeResult(len(devices), platform, engine.runner.backend.name, len(engine.runner.program_keys()),
                           ready, tokens, new_tokens, config.vocab_size, stats.compiles_on_request_path)
    finally:
        engine.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--attention", choices=("auto", "xla", "pallas"), default="auto")
    ap.add_argument("--new-tokens", type=int, default=8)
    args = ap.parse_args(argv)
    result = engine_warmup(attention=args.attention, new_tokens=args.new_tokens)
    print(result.line())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
