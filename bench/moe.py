"""Routed experts: decode step time of a tiny random qwen3_moe with 8 vs 64 experts, side by side in one run.

Both models have the same shape except the number of experts: the same top-k, expert size, attention and
vocabulary, so a step that reads only the routed experts costs about the same for both, while a layer that
ran every expert would cost ~E/8 times more at 64 (~8x). Each model runs through the engine's real step:
`Engine(...).runner.run` (the decode forward in the layout the engine uses on this platform — "unrolled" on
CPU — then masking and sampling) at batch 1 and 16, every row decoding at position 100. Each (experts, batch) is warmed up, then timed over --steps steps; the median is reported.
The whole comparison runs --repeats times (rounds interleave the two models) and prints the 64/8 ratio per
batch size for each round.

    python bench/moe.py [--steps 40] [--repeats 2] [--hidden 512] [--moe-intermediate 256] [--top-k 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def random_moe(num_experts: int, args):
    import jax
    from flax import nnx

    from jaxchat.models import LoadedModel, ModelConfig
    from jaxchat.models.families import abstract_model

    cfg = ModelConfig(family="qwen3_moe", vocab_size=1024, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                      num_layers=args.layers, num_heads=8, num_kv_heads=2, head_dim=args.hidden // 8, qk_norm=True,
                      num_experts=num_experts, num_experts_per_tok=args.top_k,
                      moe_intermediate_size=args.moe_intermediate, norm_topk_prob=True)
    graphdef, abstract = abstract_model(cfg, "float32")
    leaves, tree = jax.tree.flatten(nnx.to_pure_dict(abstract))
    keys = jax.random.split(jax.random.key(num_experts), len(leaves))
    params = jax.tree.unflatten(tree, [jax.random.normal(k, x.shape, x.dtype) * 0.05 for k, x in zip(keys, leaves,
                                                                                                       strict=True)])
    return LoadedModel(cfg, graphdef, params, "float32", tokenizer=None, eos_token_ids=(), source=f"random:{num_experts}")


def step_times(runner, batch: int, steps: int, warmup: int = 3) -> float:
    """Median seconds of one decode step at `batch` rows."""
    from jaxchat.engine.plan import sampling_values
    from jaxchat.engine.step import RowInput
    from jaxchat.engine.types import GenerationRequest

    rng = np.random.default_rng(batch)
    mask = np.full(runner.mask_words, -1, np.int32)
    values = sampling_values(GenerationRequest([1]))
    per_row = -(-101 // runner.page_size)
    times = []
    for i in range(warmup + steps):
        tokens = rng.integers(0, 1024, batch)  # new tokens each step: routing changes
        rows = [RowInput(r, [int(tokens[r])], 100, list(range(1 + r * per_row, 1 + (r + 1) * per_row)), False, 100,
                         101, True, mask, values) for r in range(batch)]
        t = time.perf_counter()
        runner.run(rows)  # returns host arrays: the step has finished
        if i >= warmup:
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--experts", default="8,64")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--moe-intermediate", type=int, default=256)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    args = ap.parse_args()
    import jax

    from jaxchat.engine.engine import Engine

    batches = [int(b) for b in args.batches.split(",")]
    experts = [int(e) for e in args.experts.split(",")]
    print(f"jax {jax.__version__} on {jax.default_backend()}; hidden {args.hidden}, {args.layers} layers, "
          f"top-{args.top_k} of E experts of {args.moe_intermediate}, fp32")
    runners = {}
    for e in experts:
        model = random_moe(e, args)
        nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(model.params))
        engine = Engine(model, max_batch=max(batches), max_context=256, start=False, warmup=False)
        runners[e] = engine.runner
        print(f"E={e:3d}: params {nbytes / 2**20:7.1f} MiB, layout {engine.runner.layout}")
    lo, hi = min(experts), max(experts)
    for r in range(args.repeats):
        med = {(e, b): step_times(runners[e], b, args.steps) for b in batches for e in experts}
        for b in batches:
            cols = "  ".join(f"E={e}: {med[e, b] * 1e3:7.2f} ms" for e in experts)
            print(f"round {r + 1}  batch {b:2d}  {cols}  ratio {hi}/{lo}: {med[hi, b] / med[lo, b]:.2f}x")


if __name__ == "__main__":
    main()
