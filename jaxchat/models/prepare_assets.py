"""Fill the converted-weights and tokenizer caches of every fetched GGUF asset, ahead of their first use.

`python -m jaxchat.models.prepare_assets [NAME ...]` writes, for each named GGUF asset (all fetched ones when none
is named), the dequantised float32 safetensors file that `load_gguf` maps (`gguf_loader.fill_dequantized_cache`)
and the converted tokenizer (`gguf_loader.gguf_tokenizer`). A newcomer's first `jaxchat serve` then maps them
instead of spending tens of seconds converting. Assets not fetched yet are skipped with a line saying so; an
existing cache is kept. Exit status 1 on an unknown name. `prepare(name)` is one asset's part (it returns the
tokenizer and logits size too); `python -m jaxchat.prepare`, which scripts/bootstrap.sh runs after the asset
fetch, runs it and then fills the grammar engine's cache as well.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, NamedTuple


class Prepared(NamedTuple):
    """What `prepare` did (a line saying it) and, for an asset it prepared, the model's tokenizer and logits size,
    as `load_gguf` would give them."""

    line: str
    tokenizer: Any = None
    vocab_size: int | None = None


def prepare(name: str) -> Prepared:
    """Fill the caches of the GGUF asset `name`."""
    import gguf

    from jaxchat.assets import AssetError, asset_path
    from jaxchat.models.gguf_loader import field, fill_dequantized_cache, gguf_config, gguf_tokenizer, open_cache

    try:
        path = asset_path(name)
    except AssetError:
        return Prepared(f"{name}: not fetched, skipped")
    t0 = time.perf_counter()
    cache = fill_dequantized_cache(path)
    _, meta = open_cache(cache)
    template = meta["chat_template"] if meta else field(gguf.GGUFReader(str(path)), "tokenizer.chat_template")
    gguf_tokenizer(path, template)
    where = cache if cache is not None else "no weights cache (turned off or unwritable)"
    line = f"{name}: converted weights and tokenizer ready in {time.perf_counter() - t0:.1f} s ({where})"
    return Prepared(line, gguf_tokenizer(path, template), gguf_config(path).vocab_size)  # as a start loads them


def gguf_asset_names(argv: list[str] | None, prog: str, description: str) -> list[str] | None:
    """The GGUF assets named on the command line `argv` (none named: every GGUF asset); None, with a message on
    stderr, when one is not a GGUF asset."""
    from jaxchat.assets import ASSETS

    gguf_assets = [name for name in ASSETS if name.endswith(".gguf")]
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"one of: {', '.join(gguf_assets)}")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in gguf_assets]
    if unknown:
        print(f"error: not a GGUF asset: {', '.join(unknown)}; known: {', '.join(gguf_assets)}", file=sys.stderr)
        return None
    return args.names or gguf_assets


def main(argv: list[str] | None = None) -> int:
    names = gguf_asset_names(argv, "python -m jaxchat.models.prepare_assets", __doc__.splitlines()[0])
    if names is None:
        return 1
    for name in names:
        print(prepare(name).line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
