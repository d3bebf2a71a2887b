"""Weight-loading benchmark: `load_model` of the default model from its converted-weights cache, this checkout
against another, side by side in one run, with the ratio.

Each load runs in a fresh subprocess of the checkout it measures (its own `jaxchat` on PYTHONPATH), with jax,
transformers and jaxchat imported before the clock starts: the figure is the weights (the cache read, the layout
conversion, the device copy) and the tokenizer, what a second `jaxchat serve` or `jaxchat.LLM()` pays before it
compiles or loads programs. The checkouts alternate for `--rounds` rounds so that a slow spell of a shared
machine hits both; the min and the median of each are printed, and the ratio of the medians.

    git worktree add /tmp/prev <commit>
    python bench/load_weights.py --against /tmp/prev [--model PATH] [--rounds 5]

Each checkout has its own converted-weights cache (`own_cache`: the other assets are shared), filled by a first
round that is not counted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from own_cache import own_cache

ROOT = Path(__file__).resolve().parents[1]

LOAD = """
import sys, time
import jax, transformers  # noqa: F401  (imports are not part of the figure)
from jaxchat.models import load_model
from jaxchat.assets import DEFAULT_MODEL, asset_path
path = sys.argv[1] or asset_path(DEFAULT_MODEL)
started = time.perf_counter()
model = load_model(path)
jax.block_until_ready(model.params)
print(f"SECONDS {time.perf_counter() - started:.3f}")
"""


def load_seconds(root: Path, model: str, cache: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(root), "TQDM_DISABLE": "1", "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"),
           "JAXCHAT_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, "-c", LOAD, model], cwd=root, env=env, capture_output=True, text=True,
                          timeout=900, check=False)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("SECONDS ")), None)
    if proc.returncode != 0 or line is None:
        raise SystemExit(f"load failed in {root}:\n{proc.stderr[-3000:]}")
    return float(line.split()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", required=True, metavar="DIR", help="another checkout, measured in the same run")
    ap.add_argument("--model", default="", help="a model path (default: the default model's GGUF)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    roots = {"this": ROOT, "other": Path(args.against).resolve()}
    work = Path(tempfile.mkdtemp(prefix="jaxchat-load-weights-"))
    caches = {name: own_cache(work, name) for name in roots}
    try:
        compare(args, roots, caches)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def compare(args: argparse.Namespace, roots: dict[str, Path], caches: dict[str, Path]) -> None:
    for name, root in roots.items():
        load_seconds(root, args.model, caches[name])  # fills the converted-weights cache; not counted
    times: dict[str, list[float]] = {name: [] for name in roots}
    for r in range(args.rounds):
        for name, root in (roots.items() if r % 2 == 0 else reversed(roots.items())):
            times[name].append(load_seconds(root, args.model, caches[name]))
            print(f"round {r + 1} {name}: {times[name][-1]:.2f} s", flush=True)
    for name, root in roots.items():
        print(f"{name:6s} {root}: min {min(times[name]):.2f} s, median {statistics.median(times[name]):.2f} s")
    ratio = statistics.median(times["other"]) / statistics.median(times["this"])
    print(f"this checkout loads {ratio:.2f}x as fast as the other (ratio of medians)")


if __name__ == "__main__":
    main()
