"""KV reads of one decode step: bytes the step's programs access (XLA's cost analysis) for one 8k-token row beside
fifteen 256-token rows, against the ragged minimum (the weights the step reads once, plus every row's own length
times the KV bytes a token takes), and against what attention over one dense span for all rows would read.

The step is the engine's own: the default model (or --random-config, the same shape with random weights) on
the CPU layout, its decode forward for 16 rows and its sampler, lowered for this step's page tables. XLA's cost
analysis counts a while loop's body once, so the attention loops are lowered unrolled to the number of
iterations this step runs (`XlaAttention.trip_counts`, computed from the same plan the step builds): the bytes
are those of every iteration. XLA's cost analysis also charges a gather with the whole array it indexes (every
page of the pool, for each item gather; the whole embedding table for a lookup of 16 rows) and a scatter with
the whole array it writes into; `bench/hlo_bytes.py` walks the same optimized HLO and charges them what they
touch instead. Both figures are printed, and XLA's own total beside the walk's plain one (they agree when the
walk reads the HLO right); the bar is on the touched bytes.

    python bench/kv_reads.py [--long 8192] [--short 256] [--rows 16] [--random-config]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--long", type=int, default=8192, help="the long row's context (tokens)")
    ap.add_argument("--short", type=int, default=256, help="each other row's context")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--random-config", action="store_true", help="random weights of the default model's shape")
    args = ap.parse_args()

    import jax
    import jax.numpy as jnp

    from jaxchat.engine import attention_xla, pool_size
    from jaxchat.engine.engine import attention_backend
    from jaxchat.engine.plan import sampling_values
    from jaxchat.engine.program_key import ProgramKey
    from jaxchat.engine.step import RowInput, StepRunner, make_mesh
    from jaxchat.engine.step_args import pack_sample, pack_step
    from jaxchat.engine.types import GenerationRequest

    if args.random_config:
        from bench.decode import random_model

        model = random_model("qwen2.5-0.5b", "float32")
    else:
        from jaxchat.assets import DEFAULT_MODEL, asset_path
        from jaxchat.models import load_model

        model = load_model(asset_path(DEFAULT_MODEL), "float32")
    ps = args.page_size
    lengths = [args.long] + [args.short] * (args.rows - 1)
    per_row = [-(-n // ps) for n in lengths]
    num_pages = sum(per_row) + 1
    step_model = model.step_model(model.params, "cpu")
    backend = attention_backend("xla", model.config, "cpu", ps)  # the engine's own CPU backend

    def runner_with(backend):
        return StepRunner(step_model, max_batch=args.rows, max_context=args.long, vocab_size=model.config.vocab_size,
                          valid_vocab=model.config.vocab_size, mesh=make_mesh(jax.devices()[:1]), backend=backend,
                          num_pages=num_pages, token_buckets=(16,), decode_rows=(args.rows,),
                          ragged_rows=(args.rows,))

    runner = runner_with(backend)
    pages = iter(range(1, num_pages))
    values = sampling_values(GenerationRequest([1]))
    rows = [RowInput(slot=i, tokens=[1], start=n - 1, pages=[next(pages) for _ in range(k)], fresh=False,
                     prompt_len=n - 1, count_from=n, samples=True, mask=np.full(runner.mask_words, -1, np.int32),
                     sampling=values) for i, (n, k) in enumerate(zip(lengths, per_row, strict=True))]
    key = ProgramKey.decode(args.rows)
    forward_args, sample_args = runner.pack(key, rows)
    # the number of loop iterations this step runs: the plan the step itself builds, evaluated here
    blocks = attention_xla.decode_blocks(jax.tree.map(jnp.asarray, forward_args.step))
    kv_block = backend.kv_block_of(blocks)
    item_bytes = kv_block * attention_xla.key_page_bytes(jax.tree.leaves(runner.state.pools)[0])
    items = attention_xla.plan_items(blocks, jnp.asarray(forward_args.step.page_tables), ps, kv_block, None,
                                     attention_xla.items_per_iteration(blocks, item_bytes, backend.iteration_bytes))
    trips = int(items.trips)
    runner.release()
    runner = runner_with(dataclasses.replace(backend, trip_counts=(trips,)))

    from bench.hlo_bytes import hlo_bytes

    def accessed(program, *call_args) -> dict[str, float]:
        return hlo_bytes(program.lower(*call_args).compile())

    forward = accessed(runner._programs[key], runner.params, runner.state, pack_step(forward_args))
    logits = jax.ShapeDtypeStruct((args.rows, model.config.vocab_size), jnp.float32)
    ints, floats = pack_sample(sample_args)
    sample = accessed(runner._programs[ProgramKey.sample(args.rows)], runner.state, logits, ints, floats,
                      sample_args.bitmask)
    params, head_vd = runner.params, runner.params.get("head_vd")
    nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    if head_vd is not None and model.config.tie_word_embeddings:
        # the tied table is looked up (a few rows) while the logits read the vocab-major copy
        nbytes -= sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params["embed"]))
    per_token = pool_size.kv_bytes_per_token(model)
    minimum = nbytes + sum(lengths) * per_token
    dense = nbytes + args.rows * args.long * per_token
    print(f"rows: 1 x {args.long} + {args.rows - 1} x {args.short} tokens, pages of {ps}, items of {kv_block} pages, "
          f"{trips} loop iteration(s) per layer")
    print(f"weights read once: {nbytes / 1e9:.3f} GB; KV of the rows' own lengths: {sum(lengths) * per_token / 1e9:.3f} GB "
          f"({per_token} bytes per token)")
    print(f"ragged minimum {minimum / 1e9:.3f} GB; one dense span for every row would read {dense / 1e9:.3f} GB "
          f"({dense / minimum:.2f}x)")
    for what, label in (("xla", "XLA's cost analysis"), ("plain", "the HLO walk, every operand whole"),
                        ("touched", "the HLO walk, gathers and scatters charged what they touch")):
        step = forward[what] + sample[what]
        print(f"{label}: the step accesses {step / 1e9:.3f} GB (forward {forward[what] / 1e9:.3f}, sampler "
              f"{sample[what] / 1e9:.3f}): {step / minimum:.2f}x the ragged minimum")


if __name__ == "__main__":
    main()
