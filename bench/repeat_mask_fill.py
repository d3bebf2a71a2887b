"""Does a rewrite of the serve mix's regex make xgrammar's mask fill cheaper? (issue 51; a question, no bar)

`bench/serve.py --constraint mix`'s regex family, `[A-Z][a-z]{2,12}( [a-z]{1,12}){8,200}\\.`, costs 6-11 ms a row
a step in xgrammar's mask fill (`bench/mix_mask_fill.py`). This compiles, on the default model's tokenizer, the
regex as xgrammar reads it, the same language with each bounded character-class repetition expanded into nested
optional rules (`w1 ::= [a-z] w2?` ... : each count its own rule, which xgrammar's mask cache could precompute),
and, for scale, the unbounded `[a-z]+` words (a different language); then walks one valid sentence token by token,
timing `GrammarMatcher.fill_next_token_bitmask` at each step, and checks that the expansion's masks equal the
regex's at every step. Prints one line per form.

    .venv/bin/python bench/repeat_mask_fill.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import xgrammar as xgr

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jaxchat.assets import DEFAULT_MODEL, asset_path  # noqa: E402
from jaxchat.models.gguf_loader import gguf_tokenizer  # noqa: E402

VOCAB = 151936  # the default model's logits
REGEX = r"[A-Z][a-z]{2,12}( [a-z]{1,12}){8,200}\."
TEXT = "The robot painted a small blue house near the river today and everyone smiled happily."


def nested(cls: str, lo: int, hi: int, name: str) -> list[str]:
    """EBNF rules `name1` .. `name{hi}` matching `cls{lo,hi}`: rule i takes one `cls`, then rule i+1 (optional
    from the `lo`-th on)."""
    rules = []
    for i in range(1, hi + 1):
        rest = "" if i == hi else f" {name}{i + 1}" + ("?" if i >= lo else "")
        rules.append(f"{name}{i} ::= {cls}{rest}")
    return rules


def main() -> None:
    tokenizer = gguf_tokenizer(asset_path(DEFAULT_MODEL), None)
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=VOCAB))
    expanded = ['root ::= [A-Z] f1 (" " w1){8, 200} "."', *nested("[a-z]", 2, 12, "f"), *nested("[a-z]", 1, 12, "w")]
    forms = {
        "regex (as xgrammar reads it)": xgr.Grammar.from_regex(REGEX),
        "nested rules (same language)": xgr.Grammar.from_ebnf("\n".join(expanded)),
        "[a-z]+ words (unbounded)": xgr.Grammar.from_ebnf('root ::= [A-Z] [a-z]+ (" " [a-z]+){8, 200} "."'),
    }
    ids = tokenizer.encode(TEXT)
    bitmask = xgr.allocate_token_bitmask(1, VOCAB)
    reference = None
    for name, grammar in forms.items():
        start = time.perf_counter()
        matcher = xgr.GrammarMatcher(compiler.compile_grammar(grammar))
        compile_ms = (time.perf_counter() - start) * 1e3
        times, masks = [], []
        for token in ids:
            start = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            times.append((time.perf_counter() - start) * 1e3)
            masks.append(bitmask.numpy().copy())
            if not matcher.accept_token(token):
                raise SystemExit(f"{name}: the sentence's token {token} is refused")
        same = "" if reference is None else (
            "; masks equal to the regex's at every step" if all((a == b).all() for a, b in zip(reference, masks))
            else "; masks differ from the regex's")
        reference = masks if reference is None else reference
        print(f"{name:30s} compile {compile_ms:6.1f} ms  fill p50 {statistics.median(times):6.2f} ms  "
              f"max {max(times):6.2f} ms over {len(times)} steps{same}")


if __name__ == "__main__":
    main()
