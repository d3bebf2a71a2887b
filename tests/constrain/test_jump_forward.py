"""Jump-forward at the constraint level (the engine side is tests/engine/test_jump_forward.py).

- `forced_token_ids`: the forced text's tokens as the tokenizer spells them after the previous token, less
  the last one; spelled on its own where that spelling would merge text into the previous token.
- A named tool call on the real Qwen2.5 vocabulary: the grammar forces the call's opening markup and the
  name, the tokens taken for it decode to a prefix of that text and every one is accepted; a token the grammar
  does not take is refused by `accept_jumped` without giving up or moving the matcher.
- Walks over a strict json_schema reply (one compact layout) take its keys and separators as forced tokens.
"""

from __future__ import annotations

import numpy as np

from jaxchat.chat import chat_format_make
from jaxchat.engine.jump_forward import forced_token_ids
from tests.constrain.support import make_request, output_text, walk


def test_forced_token_ids_keeps_the_tokenizer_spelling_after_the_previous_token():
    vocab = {"a": 1, "b": 2, "ab": 3, "c": 4, "d": 5}

    def encode(text: str) -> list[int]:  # greedy longest match over a toy vocabulary
        out, i = [], 0
        while i < len(text):
            piece = max((p for p in vocab if text.startswith(p, i)), key=len)
            out.append(vocab[piece])
            i += len(piece)
        return out

    decode = {v: k for k, v in vocab.items()}

    def decode_ids(ids):
        return "".join(decode[i] for i in ids)

    assert forced_token_ids(encode, decode_ids, 4, "cdcd") == [4, 5, 4]  # "c" + "cdcd": the last token left out
    assert forced_token_ids(encode, decode_ids, 1, "bcd") == [2, 4]  # "a" + "b..." spells "ab": "bcd" alone
    assert forced_token_ids(encode, decode_ids, 4, "d") == []  # one token: nothing safe to take
    assert forced_token_ids(encode, decode_ids, 4, "") == []


def _hermes(qwen25):
    return chat_format_make("hermes_json")


def test_named_tool_call_forces_its_opening_and_name(qwen25):
    spec = _hermes(qwen25)
    constraint = qwen25.engine.make(spec, make_request("named"), "")
    forced = constraint.forced_text()
    assert forced.startswith("<tool_call>") and '"search"' in forced, forced
    prev = qwen25.encode("\n")[-1]
    ids = forced_token_ids(qwen25.encode, qwen25.decode, prev, forced)
    assert len(ids) >= 5 and forced.startswith(qwen25.decode(ids))
    assert ids == qwen25.encode(qwen25.decode([prev]) + forced)[1 : len(ids) + 1]
    for token in ids:
        assert constraint.accept_jumped(token)
    rest = forced[len(qwen25.decode(ids)):]
    assert constraint.forced_text() == rest  # the matcher moved exactly past the taken text
    wrong = qwen25.encode("zzz")[0]
    assert not constraint.accept_jumped(wrong)
    assert not constraint.disabled and constraint.forced_text() == rest


def test_a_json_schema_walk_takes_forced_tokens(qwen25):
    spec = _hermes(qwen25)
    request = make_request("none", "json_schema_strict")
    prev = qwen25.encode("\n")[-1]
    forced_total = chosen_total = 0
    for seed in range(3):
        constraint = qwen25.engine.make(spec, request, "")
        chosen: list[int] = []
        accept = constraint.accept

        def counting_accept(token, accept=accept, chosen=chosen):
            chosen.append(token)
            return accept(token)

        constraint.accept = counting_accept
        ids, finished = walk(qwen25, constraint, [], np.random.default_rng(seed), 400, None, [], prev)
        assert finished and not constraint.disabled
        assert output_text(qwen25, ids).startswith('{"answer":"')  # the compact layout of a strict schema
        forced_total += len(ids) - len(chosen)
        chosen_total += len(chosen)
    assert forced_total >= 9, (forced_total, chosen_total)  # at least the keys and separators of each reply
