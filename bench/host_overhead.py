"""Host overhead of the engine's loop: the step period with the model's forward swapped for a trivial program, the
rest real (scheduler, sampler program, xgrammar masks for real grammars over the default model's vocabulary,
detokeniser, stop checks), at 1, 16 and 64 rows, unconstrained, with tools (tool_choice "required": the grammar
works on every token) and with a JSON schema on every row.

The forward is swapped for an instant program, and the device is emulated beside it: on this CPU the "device" is
the host's own cores (XLA:CPU runs a program on them, and a program that waits, a host callback that sleeps, is
run synchronously at dispatch), so a forward that keeps a device busy while the host works cannot be a real
program here. `DeviceClock` gives the runner a separate processor's timing: each forward occupies the emulated
device for `--device-ms` from its launch (or from when the device frees, if later), and the host's fetch of a
step's tokens returns no earlier than the end of the forward that step sampled from; the sampler program itself
runs for real, on the host's cores (about 40 ms at 64 rows over this model's 151,936-token vocabulary here: the
default `--device-ms` 60 is longer, so that the emulated forward, not the sampler, sets the pace). The engine's two loops run side by side in one run: the loop that takes tokens between steps
(`overlap=False`: the period is device + host) and the overlapped loop (`overlap=True`: the host takes step N's
tokens and fills the masks while step N+1's forward runs, so the period is max(device, host) while the host keeps
up). Per case it prints the host's time per step (the step's wall time less its wait for the device; instant
forward) in both loops; the period with the forward of set duration in both loops and what each adds to that
duration; and how much of what the in-turn loop adds the overlapped loop hides ((period in turn - period
overlapped) / (period in turn - duration): 100% when the host's work is wholly hidden behind the forward).

With --against DIR (a checkout of another commit, e.g. `git worktree add /tmp/prev <commit>`), the host time per step
of that checkout's loop (its only loop, instant program) is measured too, in a subprocess, and printed beside
this checkout's in-turn loop with the ratio (this / that).

    python bench/host_overhead.py [--rows 1,16,64] [--steps 40] [--device-ms 60] [--against /tmp/prev]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}, "confidence": {"type": "integer"},
                                           "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["answer", "confidence", "tags"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]
BODIES = {
    "free": None,
    "tools": {"tools": TOOLS, "tool_choice": "required"},
    "json": {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}},
}


class DeviceClock:
    """An emulated device beside the host (see the module docstring): wraps `runner`'s launch, sample and fetch
    while installed. A forward launched at t starts at max(t, when the device frees) and ends `ms` later; a sample
    reads the last launched forward; a fetch returns no earlier than that forward's end (the host sleeps: its
    cores stay free for the sampler program and anything else the host runs)."""

    def __init__(self, runner, ms: float):
        self.runner, self.seconds = runner, ms / 1000
        self.free_at = self.launched_end = self.sampled_end = 0.0
        self.originals = {name: getattr(runner, name) for name in ("launch", "sample", "fetch")}

    def launch(self, *a, **k):
        self.launched_end = self.free_at = max(time.perf_counter(), self.free_at) + self.seconds
        return self.originals["launch"](*a, **k)

    def sample(self, *a, **k):
        self.sampled_end = self.launched_end
        return self.originals["sample"](*a, **k)

    def fetch(self, *a, **k):
        time.sleep(max(0.0, self.sampled_end - time.perf_counter()))
        return self.originals["fetch"](*a, **k)

    def __enter__(self):
        for name in self.originals:
            setattr(self.runner, name, getattr(self, name))
        return self

    def __exit__(self, *exc):
        for name in self.originals:
            delattr(self.runner, name)


class TrivialModel:
    """What the engine uses of a loaded model, with a forward that costs nearly nothing: pseudo-random logits from
    each row's last token (so grammars are walked, not stuck on the lowest id)."""

    def __init__(self, real):
        import jax.numpy as jnp

        self.config, self.tokenizer, self.eos_token_ids = real.config, real.tokenizer, real.eos_token_ids
        self.dtype, self.mesh = jnp.float32, None
        self.params = {"bias": jnp.zeros((8,), jnp.float32)}

    def forward(self, params, tokens, pools, step, backend, *, uniform=None, logits_index=None, head_vd=None):
        import jax.numpy as jnp

        last = tokens[logits_index].astype(jnp.uint32)
        vocab = jnp.arange(self.config.vocab_size, dtype=jnp.uint32)
        mixed = (last[:, None] * jnp.uint32(2654435761) + vocab[None, :] * jnp.uint32(40503)) >> 7
        logits = (mixed & 1023).astype(jnp.float32) / 64.0 + params["bias"][0]
        return logits, pools

    def partition_specs(self, mesh):
        from jax.sharding import PartitionSpec as P

        return {"bias": P()}

    def kv_dims(self):
        return [(1, 8)]

    def new_pools(self, backend, num_pages: int, page_size: int, num_slots: int):
        import jax.numpy as jnp

        return jnp.zeros((2,), jnp.float32)

    def step_model(self, params, platform: str, layout=None):
        from jaxchat.models import StepModel

        return StepModel(layout="unrolled", params=params, forward=self.forward, new_pools=self.new_pools,
                         vocab_major_head=None)


def period_ms(engine, grammar, spec, body, rows: int, steps: int) -> tuple[float, float]:
    """(median step period, median host time per step) in ms while `rows` requests decode under `body`'s
    constraint (None: unconstrained). Host time: the step's wall time less the time it waited for the device
    (`runner.fetch`, or the whole `run` of a loop without it)."""
    from jaxchat.chat import chat_constraint_request_from_openai
    from jaxchat.engine.types import GenerationRequest, SamplingParams

    sched, runner = engine.scheduler, engine.runner
    waited = [0.0]
    name = "fetch" if hasattr(runner, "fetch") else "run"
    original, wrapped = getattr(runner, name), name in vars(runner)

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            out = original(*a, **k)
            np.asarray(out.tokens)  # the host has the tokens
            return out
        finally:
            waited[0] += time.perf_counter() - t0

    setattr(runner, name, timed)
    done = []
    for i in range(rows):
        constraint = None
        if body is not None:
            request = chat_constraint_request_from_openai({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                           **body})
            constraint = grammar.make(spec, request, "")
        sched.submit(GenerationRequest([100 + i, 200, 300, 400], SamplingParams(max_tokens=steps + 8, ignore_eos=True),
                                       constraint, f"r{i}"), lambda out: done.append(out) if out.finished else None)
    periods, hosts = [], []
    while engine.core.has_work():
        waited[0] = 0.0
        t0 = time.perf_counter()
        engine.core.step()
        periods.append(time.perf_counter() - t0)
        hosts.append(periods[-1] - waited[0])
    if wrapped:
        setattr(runner, name, original)
    else:
        delattr(runner, name)
    assert len(done) == rows, f"{len(done)} of {rows} finished"
    span = slice(6, 6 + steps) if len(periods) > 6 + steps // 2 else slice(None)
    return 1000 * float(np.median(periods[span])), 1000 * float(np.median(hosts[span]))


def measure(rows_list, steps: int, device_ms: float, loops: list[bool | None]) -> dict:
    """{f"{mode}|{rows}|{device_ms}|{overlap}": period ms}; overlap None: the engine's own loop (no argument)."""
    from jaxchat.assets import DEFAULT_MODEL, asset_path
    from jaxchat.chat import chat_format_detect
    from jaxchat.constrain import GrammarEngine
    from jaxchat.engine.engine import Engine
    from jaxchat.models import load_model

    real = load_model(asset_path(DEFAULT_MODEL), "float32")
    tok = real.tokenizer
    vocab = set(tok.get_vocab())
    spec = chat_format_detect(tok.chat_template, lambda s: s in vocab)
    grammar = GrammarEngine(tok, vocab_size=real.config.vocab_size)
    out = {}
    top = max(rows_list)
    model = TrivialModel(real)
    for overlap in loops:
        extra = {} if overlap is None else {"overlap": overlap}
        engine = Engine(model, max_batch=top, max_context=256, start=False, num_pages=16 * top + 1, page_size=16,
                        decode_rows=tuple(sorted(set(rows_list))), step_token_buckets=(4 * top,), programs="all",
                        speculative="off", **extra)
        for delay in sorted({0.0, device_ms}):
            with DeviceClock(engine.runner, delay) if delay > 0 else contextlib.nullcontext():
                for rows in rows_list:
                    for mode, body in BODIES.items():
                        out[f"{mode}|{rows}|{delay}|{overlap}"] = period_ms(engine, grammar, spec, body, rows, steps)
        engine.shutdown()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="1,16,64")
    ap.add_argument("--steps", type=int, default=40, help="steady steps measured per case")
    ap.add_argument("--device-ms", type=float, default=60.0,
                    help="how long the emulated device runs a forward (longer than the sampler program here)")
    ap.add_argument("--against", default=None, help="another checkout: its loop's instant-program periods too")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a subprocess of --against
    ap.add_argument("--own-loop", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    rows_list = [int(r) for r in args.rows.split(",")]
    if args.own_loop:
        print(json.dumps(measure(rows_list, args.steps, 0.0, [None])))
        return
    other = None
    if args.against:
        cmd = [sys.executable, str(ROOT / "bench" / "host_overhead.py"), "--rows", args.rows, "--steps",
               str(args.steps), "--own-loop"]
        env = {"PYTHONPATH": str(Path(args.against).resolve())}
        import os

        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=args.against, env={**os.environ, **env},
                              check=True)
        other = json.loads(proc.stdout.strip().splitlines()[-1])
    got = measure(rows_list, args.steps, args.device_ms, [False, True])
    d = float(args.device_ms)
    print(f"ms per step (median of {args.steps} steady steps). host: the step's time less its wait for the device,")
    print(f"the forward instant. period: the step's time with an emulated device that runs the forward in {d:g} ms;")
    print(f"+: the period less {d:g} ms. hidden: how much of the in-turn loop's + the overlapped loop takes away.")
    head = (f"{'mode':>6} {'rows':>5} | {'host, in turn':>13} {'overlapped':>10} | {'period, in turn':>15} {'+':>6}"
            f" {'overlapped':>10} {'+':>6} {'hidden':>7}")
    if other is not None:
        head += f" | {'host, --against':>15} {'ratio':>6}"
    print(head)
    for rows in rows_list:
        for mode in BODIES:
            (_, h_off), (_, h_on) = got[f"{mode}|{rows}|0.0|False"], got[f"{mode}|{rows}|0.0|True"]
            (d_off, _), (d_on, _) = got[f"{mode}|{rows}|{d}|False"], got[f"{mode}|{rows}|{d}|True"]
            hidden = (d_off - d_on) / (d_off - d) if d_off > d else float("nan")
            line = (f"{mode:>6} {rows:>5} | {h_off:13.2f} {h_on:10.2f} | {d_off:15.2f} {d_off - d:6.2f} {d_on:10.2f}"
                    f" {d_on - d:6.2f} {hidden:7.0%}")
            if other is not None:
                prev = other[f"{mode}|{rows}|0.0|None"][1]
                line += f" | {prev:15.2f} {h_off / prev:6.2f}"
            print(line)

if __name__ == "__main__":
    main()
