"""Fill the converted-weights and tokenizer caches of every fetched GGUF asset, ahead of their first use.

`python -m jaxchat.models.prepare_assets [NAME ...]` (scripts/bootstrap.sh runs it after the asset fetch) writes,
for each named GGUF asset (all fetched ones when none is named), the dequantised float32 safetensors file that
`load_gguf` maps (`gguf_loader.fill_dequantized_cache`) and the converted tokenizer (`gguf_loader.gguf_tokenizer`).
A newcomer's first `jaxchat serve` then maps them instead of spending tens of seconds converting. Assets not
fetched yet are skipped with a line saying so; an existing cache is kept. Exit status 1 on an unknown name.
"""

from __future__ import annotations

import argparse
import sys
import time


def prepare(name: str) -> str:
    """Fill the caches of the GGUF asset `name`; returns a line saying what was done."""
    import gguf

    from jaxchat.assets import AssetError, asset_path
    from jaxchat.models.gguf_loader import field, fill_dequantized_cache, gguf_tokenizer, open_cache

    try:
        path = asset_path(name)
    except AssetError:
        return f"{name}: not fetched, skipped"
    t0 = time.perf_counter()
    cache = fill_dequantized_cache(path)
    _, meta = open_cache(cache)
    template = meta["chat_template"] if meta else field(gguf.GGUFReader(str(path)), "tokenizer.chat_template")
    gguf_tokenizer(path, template)
    where = cache if cache is not None else "no weights cache (turned off or unwritable)"
    return f"{name}: converted weights and tokenizer ready in {time.perf_counter() - t0:.1f} s ({where})"


def main(argv: list[str] | None = None) -> int:
    from jaxchat.assets import ASSETS

    gguf_assets = [name for name in ASSETS if name.endswith(".gguf")]
    parser = argparse.ArgumentParser(prog="python -m jaxchat.models.prepare_assets", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"one of: {', '.join(gguf_assets)}")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in gguf_assets]
    if unknown:
        print(f"error: not a GGUF asset: {', '.join(unknown)}; known: {', '.join(gguf_assets)}", file=sys.stderr)
        return 1
    for name in args.names or gguf_assets:
        print(prepare(name), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
