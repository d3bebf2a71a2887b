"""Host cost per decode step of each structured-output family of `bench/serve.py --constraint mix` (issue 51).

For each family (regex, choice, EBNF grammar, JSON schema, required tool call) on the default model's tokenizer
and its chat format: the constraint's first build (`GrammarEngine.make`, the compile included: what a cold
server pays once per grammar), then, token by token along a valid output of the family, `fill_mask` (the host's
mask fill for one row) and `accept`; last, 16 rows of the families in turn filled together per step
(`GrammarConstraint.fill_masks`, the engine's batched call), as the serve bench's c=16 level runs them. Beside
each figure, the library's own: xgrammar's `GrammarMatcher.fill_next_token_bitmask` on the same compiled grammar
along the same tokens, and `BatchGrammarMatcher.batch_fill_next_token_bitmask` for the 16 rows (what the mask
fill costs at best with the chosen library on this machine), and the ratio ours / xgrammar's. Prints one line
per family and the batched figures; no bar (it explains the serve bench's per-step cost).

    .venv/bin/python bench/mix_mask_fill.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np
import xgrammar as xgr

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serve  # noqa: E402

from jaxchat.api import parse_chat_request  # noqa: E402
from jaxchat.bitmask import mask_words  # noqa: E402
from jaxchat.chat import chat_format_make  # noqa: E402
from jaxchat.constrain.constraint import GrammarConstraint  # noqa: E402
from jaxchat.constrain.grammar_engine import GrammarEngine  # noqa: E402

VOCAB = 151936  # the default model's logits
TEXTS = {  # a valid output of each family (greedy-like: what the serve bench's model writes, roughly)
    "regex": "The robot painted the sunrise over the sea with thin layers of gold and orange light.",
    "choice": serve.MIX[1]["guided_choice"][0],
    "ebnf": "Title: The Painter Robot\nThe robot learned to paint slowly. It painted the sea every single day. ",
    "json": '{"title": "The Painter", "story": "Once upon a time a robot learned to paint the sea and the sky."}',
    "tools": '<tool_call>\n{"name": "save_story", "arguments": {"title": "The Painter", "story": '
             '"Once upon a time a robot painted."}}\n</tool_call>',
}


def mix_constraint_maker():
    """The default model's tokenizer, and `make(family) -> (constraint, seconds)`: a new constraint of the serve
    mix's family on that tokenizer and chat format, and how long its build took (its grammar's compile included
    the first time)."""
    from jaxchat.assets import DEFAULT_MODEL, asset_path
    from jaxchat.models.gguf_loader import gguf_tokenizer

    tok = gguf_tokenizer(asset_path(DEFAULT_MODEL), None)
    engine = GrammarEngine(tok, vocab_size=VOCAB)
    spec = chat_format_make("hermes_json")  # the default model's format

    def make(family: str):
        fields = serve.MIX[serve.MIX_FAMILIES.index(family)]
        request = parse_chat_request({"messages": serve.MESSAGES, **fields})
        t0 = time.perf_counter()
        return engine.make(spec, request.constraint, ""), time.perf_counter() - t0

    return tok, make


def main() -> int:
    tok, make = mix_constraint_maker()
    words = mask_words(VOCAB)

    for family, text in TEXTS.items():
        constraint, build = make(family)
        row = np.zeros(words, np.int32)
        fills, accepts = [], []
        for token in tok.encode(text, add_special_tokens=False):
            t0 = time.perf_counter()
            constraint.fill_mask(row)
            t1 = time.perf_counter()
            ok = constraint.accept(token)
            accepts.append(time.perf_counter() - t1)
            fills.append(t1 - t0)
            if not ok:
                print(f"  {family}: token {len(fills)} rejected (the sample text is off the grammar)")
                break
        alone = library_fills(constraint, tok.encode(text, add_special_tokens=False)[:len(fills)])
        print(f"{family:7} first build {build * 1e3:7.1f} ms  {len(fills):3} steps  fill p50 "
              f"{statistics.median(fills) * 1e3:6.2f} ms  max {max(fills) * 1e3:6.2f} ms  accept p50 "
              f"{statistics.median(accepts) * 1e3:5.3f} ms | xgrammar alone fill p50 "
              f"{statistics.median(alone) * 1e3:6.2f} ms  ours / xgrammar "
              f"{statistics.median(fills) / max(statistics.median(alone), 1e-9):5.2f}")
    rows = [(make(f)[0], tok.encode(TEXTS[f], add_special_tokens=False)) for f in serve.MIX_FAMILIES * 4][:16]
    matchers = [library_matcher(c) for c, _ in rows]
    masks = np.zeros((16, words), np.int32)
    bitmask = xgr.allocate_token_bitmask(16, VOCAB)
    batch = xgr.BatchGrammarMatcher()
    times, library = [], []
    for step in range(15):
        live = [i for i, (_, ids) in enumerate(rows) if step < len(ids)]
        t0 = time.perf_counter()
        GrammarConstraint.fill_masks([rows[i][0] for i in live], [masks[j] for j in range(len(live))])
        times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        batch.batch_fill_next_token_bitmask([matchers[i] for i in live], bitmask[:len(live)])
        library.append(time.perf_counter() - t0)
        for i in live:
            rows[i][0].accept(rows[i][1][step])
            matchers[i].accept_token(rows[i][1][step])
    ours, theirs = statistics.median(times), statistics.median(library)
    print(f"16 rows (the families in turn), batched: fill p50 {ours * 1e3:.2f} ms  max {max(times) * 1e3:.2f} ms per "
          f"step | xgrammar's BatchGrammarMatcher alone p50 {theirs * 1e3:.2f} ms  max {max(library) * 1e3:.2f} ms  "
          f"ours / xgrammar {ours / max(theirs, 1e-9):.2f}")
    return 0


def library_matcher(constraint) -> xgr.GrammarMatcher:
    """xgrammar's own matcher on the constraint's compiled grammar and stop tokens, past the same prefill."""
    matcher = constraint.fresh_matcher()
    if constraint.prefill:
        matcher.accept_string(constraint.prefill.encode())
    return matcher


def library_fills(constraint, ids: list[int]) -> list[float]:
    """Seconds of xgrammar's own mask fill per token along `ids`."""
    matcher, bitmask, fills = library_matcher(constraint), xgr.allocate_token_bitmask(1, VOCAB), []
    for token in ids:
        t0 = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask)
        fills.append(time.perf_counter() - t0)
        if not matcher.accept_token(token):
            break
    return fills


if __name__ == "__main__":
    sys.exit(main())
