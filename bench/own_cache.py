"""A checkout's own asset cache for side-by-side benchmarks: two checkouts whose converted-weights cache formats
differ would each remove the other's file (a cache replaces other versions of itself), and convert again.

`own_cache(work, name)` -> a directory under `work` holding links to every entry of this machine's asset cache
(`jaxchat.assets.cache_dir()`: the fetched models, templates, tokenizers) but its own `dequantized/`; give it to
the checkout as `JAXCHAT_CACHE`.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def own_cache(work: Path, name: str) -> Path:
    sys.path.insert(0, str(ROOT))
    from jaxchat.assets import cache_dir

    shared, own = cache_dir(), work / f"assets-{name}"
    own.mkdir(parents=True, exist_ok=True)
    for entry in shared.iterdir():
        link = own / entry.name
        if entry.name not in ("dequantized", "jax-compilation-cache") and not link.exists():
            link.symlink_to(entry)
    return own
