"""What XLA's own int8 matmul allows on this machine: the int8 (W8A8) decode step against fp32, split into the
weight matmuls and the rest, and the best step ratio XLA's int8 kernel could give.

For one model shape (random weights: speed does not depend on the values), the CPU decode forward (the
engine's "unrolled" layout, vocab-major lm head, per-layer caches donated) runs at each batch size in fp32 and
with every weight int8, under `jax.profiler`. Each op's time is summed from the trace and sorted by the op's
instruction: a weight matmul is a dot, or a fusion around one, with no batch dimensions (attention's dots
batch over rows and kv heads); everything else (attention, norms, rope, and in int8 the activation
quantisation and rescale) is "the rest". Per batch it prints, in ms per step:

- fp32 step, its weight matmuls (XLA's fp32 kernels) and the rest;
- int8 step, its weight matmuls (XLA's int8 x int8 -> int32 kernels, fed int8) and the rest;
- the kernel ratio: fp32 weight matmuls / int8 weight matmuls;
- the ceiling: the fp32 step with its weight matmuls swapped for XLA's int8 ones and nothing added,
  fp32 step / (fp32 step - fp32 matmuls + int8 matmuls): the most any W8A8 step built on XLA's int8 dot can
  gain over fp32 here;
- ours: fp32 step / int8 step, and that as a share of the ceiling.

    python bench/int8_ceiling.py [--model qwen2.5-0.5b] [--batches 1,16] [--context 256] [--steps 8]

Profiled times run a little above unprofiled ones on both sides; the ratios are what to read.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def step_program(model, batch: int, context: int):
    """(compiled step, its first arguments): one decode token per row at position context // 2, the pool donated."""
    import jax
    import jax.numpy as jnp

    from jaxchat.engine.attention_xla import XlaAttention
    from jaxchat.engine.step import uniform_inputs

    sm = model.step_model(model.params, "cpu")
    head = sm.vocab_major_head(sm.params) if batch > 1 else None
    backend = XlaAttention(16)
    step_inputs = uniform_inputs(batch, 1, 16, start=context // 2, context=context)
    pools = sm.new_pools(backend, 1 + step_inputs.page_tables.size, 16, batch)

    def step(params, head_vd, tokens, pools, inputs):
        return sm.forward(params, tokens, pools, inputs, backend, uniform=(batch, 1), head_vd=head_vd)

    tokens = jnp.zeros((batch,), jnp.int32)
    args = [sm.params, head, tokens, pools, jax.tree.map(jnp.asarray, step_inputs)]
    return jax.jit(step, donate_argnums=(3,)).lower(*args).compile(), args


def weight_matmuls(compiled) -> set[str]:
    """Names of the compiled program's instructions that multiply by a weight: a dot, or a fusion around one,
    with no batch dimensions (attention's dots batch over items and kv heads; the weight matmuls have none), outside
    loop bodies (the attention loops' dots that combine the items of a query block have no batch dimension)."""
    hlo = compiled.as_text()
    bodies, name = {}, None
    for line in hlo.splitlines():
        head = re.match(r"(?:ENTRY )?%([\w.\-]+) .*\{$", line)
        if head:
            name = head.group(1)
            bodies[name] = []
        elif name is not None:
            bodies[name].append(line)
    fused = set(re.findall(r"kind=\w+, calls=%([\w.\-]+)", hlo))  # a fusion's body runs as the fusion
    looped = set(re.findall(r"(?:body|condition)=%([\w.\-]+)", hlo))
    found = set()
    for name, lines in bodies.items():
        if name in fused or name in looped:
            continue
        for line in lines:
            m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = .*? (dot|fusion)\(", line)
            if not m:
                continue
            if m.group(2) == "dot":
                dots = [line]
            else:
                called = re.search(r"calls=%([\w.\-]+)", line)
                dots = [x for x in bodies.get(called.group(1), []) if " dot(" in x] if called else []
            if dots and not any("lhs_batch_dims" in x for x in dots):
                found.add(m.group(1))
    return found


def profile_step(model, batch: int, context: int, steps: int) -> tuple[float, float, float]:
    """(wall ms per step, weight-matmul ms per step, other op ms per step) from a profiled run."""
    import jax

    fn, args = step_program(model, batch, context)
    matmuls = weight_matmuls(fn)
    for _ in range(3):  # warm-up; each step's pool feeds the next
        _, args[3] = fn(*args)
    jax.block_until_ready(args[3])
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d, create_perfetto_trace=True):
            t = time.perf_counter()
            for _ in range(steps):
                logits, args[3] = fn(*args)
            logits.block_until_ready()
            wall = (time.perf_counter() - t) / steps * 1e3
        trace = glob.glob(f"{d}/**/*.trace.json.gz", recursive=True)[0]
        events = json.load(gzip.open(trace))["traceEvents"]
    spent = collections.Counter()
    for e in events:  # the program's own ops are the events named like its instructions
        if e.get("ph") == "X" and re.fullmatch(r"[a-z_]+[\w.\-]*", e.get("name", "")):
            spent["matmul" if e["name"] in matmuls else "rest"] += e.get("dur", 0) / 1e3
    return wall, spent["matmul"] / steps, spent["rest"] / steps


def main(argv: list[str] | None = None) -> None:
    from bench.decode import RANDOM_CONFIGS, random_model

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(RANDOM_CONFIGS))
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)
    import jax

    from jaxchat.models.load import quantized

    print(f"devices: {jax.devices()}; model {args.model} (random weights), context {args.context}")
    fp32 = random_model(args.model, "float32")
    int8 = quantized(random_model(args.model, "float32"), "int8")
    for b in (int(x) for x in args.batches.split(",")):
        f_wall, f_mm, f_rest = profile_step(fp32, b, args.context, args.steps)
        q_wall, q_mm, q_rest = profile_step(int8, b, args.context, args.steps)
        ceiling = f_wall / (f_wall - f_mm + q_mm)
        ours = f_wall / q_wall
        print(f"batch {b:>2}: fp32 step {f_wall:7.1f} ms (weight matmuls {f_mm:7.1f}, rest {f_rest:6.1f}); "
              f"int8 step {q_wall:7.1f} ms (weight matmuls {q_mm:7.1f}, rest {q_rest:6.1f})")
        print(f"batch {b:>2}: XLA's int8 / fp32 weight matmuls {f_mm / q_mm:.2f}x; ceiling for the step "
              f"{ceiling:.2f}x; ours {ours:.2f}x = {ours / ceiling:.0%} of the ceiling")


if __name__ == "__main__":
    main()
