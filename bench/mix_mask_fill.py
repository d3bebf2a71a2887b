"""Host cost per decode step of each structured-output family of `bench/serve.py --constraint mix` (issue 51).

For each family (regex, choice, EBNF grammar, JSON schema, required tool call) on the default model's tokenizer
and its chat format: the constraint's first build (`GrammarEngine.make`, the compile included: what a cold
server pays once per grammar), then, token by token along a valid output of the family, `fill_mask` (the host's
mask fill for one row) and `accept`; last, 16 rows of the families in turn filled together per step
(`GrammarConstraint.fill_masks`, the engine's batched call), as the serve bench's c=16 level runs them. Prints
one line per family and the batched figure; no bar (it explains the serve bench's per-step cost).

    .venv/bin/python bench/mix_mask_fill.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serve  # noqa: E402

from jaxchat.api import parse_chat_request  # noqa: E402
from jaxchat.bitmask import mask_words  # noqa: E402
from jaxchat.chat import chat_format_make  # noqa: E402
from jaxchat.constrain.constraint import GrammarConstraint  # noqa: E402
from jaxchat.constrain.engine import GrammarEngine  # noqa: E402

VOCAB = 151936  # the default model's logits
TEXTS = {  # a valid output of each family (greedy-like: what the serve bench's model writes, roughly)
    "regex": "The robot painted the sunrise over the sea with thin layers of gold and orange light.",
    "choice": serve.MIX[1]["guided_choice"][0],
    "ebnf": "Title: The Painter Robot\nThe robot learned to paint slowly. It painted the sea every single day. ",
    "json": '{"title": "The Painter", "story": "Once upon a time a robot learned to paint the sea and the sky."}',
    "tools": '<tool_call>\n{"name": "save_story", "arguments": {"title": "The Painter", "story": '
             '"Once upon a time a robot painted."}}\n</tool_call>',
}


def main() -> int:
    from jaxchat.assets import DEFAULT_MODEL, asset_path
    from jaxchat.models.gguf_loader import gguf_tokenizer

    tok = gguf_tokenizer(asset_path(DEFAULT_MODEL), None)
    engine = GrammarEngine(tok, vocab_size=VOCAB)
    spec = chat_format_make("hermes_json")  # the default model's format
    words = mask_words(VOCAB)

    def make(family: str):
        fields = serve.MIX[serve.MIX_FAMILIES.index(family)]
        request = parse_chat_request({"messages": serve.MESSAGES, **fields})
        t0 = time.perf_counter()
        return engine.make(spec, request.constraint, ""), time.perf_counter() - t0

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
        print(f"{family:7} first build {build * 1e3:7.1f} ms  {len(fills):3} steps  fill p50 "
              f"{statistics.median(fills) * 1e3:6.2f} ms  max {max(fills) * 1e3:6.2f} ms  accept p50 "
              f"{statistics.median(accepts) * 1e3:5.3f} ms")
    rows = [(make(f)[0], tok.encode(TEXTS[f], add_special_tokens=False)) for f in serve.MIX_FAMILIES * 4][:16]
    masks = np.zeros((16, words), np.int32)
    times = []
    for step in range(15):
        live = [(c, ids) for c, ids in rows if step < len(ids)]
        t0 = time.perf_counter()
        GrammarConstraint.fill_masks([c for c, _ in live], [masks[i] for i in range(len(live))])
        times.append(time.perf_counter() - t0)
        for c, ids in live:
            c.accept(ids[step])
    print(f"16 rows (the families in turn), batched: fill p50 {statistics.median(times) * 1e3:.2f} ms  "
          f"max {max(times) * 1e3:.2f} ms per step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
