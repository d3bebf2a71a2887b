"""Everything a first start of a fetched model would otherwise compute, prepared ahead (scripts/bootstrap.sh runs it
after the asset fetch): `python -m jaxchat.prepare [NAME ...]`.

For each named GGUF asset (every fetched one when none is named): the converted weights and tokenizer
(`jaxchat.models.prepare_assets.prepare`), then the grammar engine's tokenizer info (xgrammar's reading of the
vocabulary, kept on disk by `jaxchat.constrain.grammar_engine`), through the very call a start's grammar engine
makes (`tokenizer_info` of the tokenizer as a start loads it, the model's logits size and the default stop ids),
so the start finds it under the same key. A first `jaxchat serve` then maps, loads and reads, and converts
nothing. Assets not fetched are skipped with a line saying so; exit status 1 on a name that is not a GGUF asset.
It lives above `models` and `constrain` because it needs both.
"""

from __future__ import annotations

import sys
import time


def main(argv: list[str] | None = None) -> int:
    from jaxchat.models.prepare_assets import gguf_asset_names, prepare

    names = gguf_asset_names(argv, "python -m jaxchat.prepare", __doc__.splitlines()[0])
    if names is None:
        return 1
    for name in names:
        done = prepare(name)
        print(done.line, flush=True)
        if done.tokenizer is not None:
            from jaxchat.constrain.grammar_engine import tokenizer_info

            t0 = time.perf_counter()
            tokenizer_info(done.tokenizer, done.vocab_size, None)
            print(f"{name}: grammar engine's tokenizer info ready in {time.perf_counter() - t0:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
