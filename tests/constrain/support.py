"""Test support: vocabularies with a GrammarEngine, the request table, and the seeded random walk.

The walk picks a uniformly random allowed token each step until the grammar terminates, the model
would stop (an end-of-turn token), or `max_steps`. Stated bias towards termination (without it free
text would run for ~10^5 tokens before an end-of-turn token came up, and nested JSON would nest
deeper about as often as it closed):
- with probability `P_MARKER` a step emits a whole format marker (tool opener, tool end, reasoning
  end, an end-of-turn token, chosen half the time when allowed) if the grammar allows its first
  token, and with probability `P_CLOSE` it picks uniformly among the allowed tokens made only of
  closing punctuation (`"}]),` and spaces);
- after `LATE` steps, with probability `P_LATE` a step emits a whole closing sequence (`"`, `'`,
  `}`, `]`, `)`, the format's end markers and end-of-turn tokens, the argument syntax's closing
  tags) that the grammar accepts, preferring one after which plain text cannot follow (it closed a
  structure rather than being text inside one), uniformly among those.
Every token is still one the grammar allows, so the bias changes which outputs are sampled, never
whether they are valid.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from jaxchat.chat import chat_constraint_request_from_openai
from jaxchat.constrain import GrammarEngine
from jaxchat.engine.jump_forward import forced_token_ids

# Markers of llama3_json, mistral and deepseek_v3 added to the Qwen2.5 tokenizer for the walks (see conftest).
ADDED_STOPS = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "</s>", "<｜end▁of▁sentence｜>")
ADDED_MARKERS = (
    *ADDED_STOPS, "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[THINK]", "[/THINK]",
    "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>",
    "<think>", "</think>",
)

P_MARKER = 0.12
P_CLOSE = 0.2
LATE = 150
P_LATE = 0.8
_CLOSERS = set('"}]), \n')


@dataclass
class Vocab:
    engine: GrammarEngine
    encode: object  # str -> list[int]
    token_bytes: list  # id -> bytes
    stops: tuple  # end-of-turn token ids (the engine stops on them)

    @staticmethod
    def hf(tokenizer, vocab_size: int, stops: tuple) -> Vocab:
        engine = GrammarEngine(tokenizer, vocab_size=vocab_size, stop_token_ids=list(stops))
        tb = [bytes(b) for b in engine.tokenizer_info.decoded_vocab]
        return Vocab(engine, lambda s: tokenizer.encode(s, add_special_tokens=False), tb, tuple(stops))

    @staticmethod
    def quicktok(name: str, stops: tuple) -> Vocab:
        import quicktok

        enc = quicktok.get_encoding(name)
        ids = tuple(enc.encode_single_token(s) for s in stops)
        engine = GrammarEngine(enc, stop_token_ids=list(ids))
        tb = [bytes(b) for b in engine.tokenizer_info.decoded_vocab]
        return Vocab(engine, enc.encode_with_special_tokens, tb, ids)

    @property
    def canary(self) -> int:
        return self.encode(" the")[0]

    def decode(self, ids) -> str:
        return b"".join(self.token_bytes[i] for i in ids).decode("utf-8", "replace")

    def closers(self) -> np.ndarray:
        if not hasattr(self, "_closers"):
            n = self.engine.vocab_size
            mask = np.zeros(n, dtype=bool)
            for i, b in enumerate(self.token_bytes[:n]):
                mask[i] = bool(b) and set(b.decode("utf-8", "replace")) <= _CLOSERS
            self._closers = mask
        return self._closers


def tokenizer_with_markers(tokenizer, markers, first_id: int):
    """A copy of a byte-level BPE tokenizer whose ids `first_id`, `first_id + 1`, ... (spare entries of
    its vocabulary) are the special tokens `markers`, so each marker is one token."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    by_id = {i: text for text, i in vocab.items()}
    for i, marker in enumerate(markers, start=first_id):
        del vocab[by_id[i]]
        vocab[marker] = i
        spec["added_tokens"].append({"id": i, "content": marker, "single_word": False, "lstrip": False,
                                     "rstrip": False, "normalized": False, "special": True})
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
                                   eos_token=tokenizer.eos_token, pad_token=tokenizer.pad_token)


# -- requests ---------------------------------------------------------------------------------------

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 14},
            "hourly": {"type": "boolean"},
        },
        "required": ["city"],
    }}},
    {"type": "function", "function": {"name": "search", "parameters": {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "score": {"type": "number"},
        },
        "required": ["query", "score"],
    }}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "confidence": {"type": "integer"}, "sure": {"type": "boolean"}},
    "required": ["answer", "confidence"],
}
MODES = {
    "auto": {},
    "required": {"tool_choice": "required"},
    "named": {"tool_choice": {"type": "function", "function": {"name": "search"}}},
    "allowed": {"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
        {"type": "function", "function": {"name": "get_weather"}}, {"type": "function", "function": {"name": "get_time"}}]}}},
    "none": {"tool_choice": "none"},
    "auto_single": {"parallel_tool_calls": False},
    "required_single": {"tool_choice": "required", "parallel_tool_calls": False},
}
RESPONSE_FORMATS = {
    "text": None,
    "json_object": {"type": "json_object"},
    "json_schema": {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}},
    # strict and no callable tools: one compact layout, so keys and separators are forced text
    "json_schema_strict": {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}},
}


def make_request(mode: str = "auto", response_format: str = "text", reasoning: bool = True, tools=True):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **MODES[mode]}
    if tools:
        body["tools"] = TOOLS
    if RESPONSE_FORMATS[response_format]:
        body["response_format"] = RESPONSE_FORMATS[response_format]
    if not reasoning:
        body["reasoning_effort"] = "none"
    return chat_constraint_request_from_openai(body)


# -- the walk ---------------------------------------------------------------------------------------


def _bit(row: np.ndarray, i: int) -> bool:
    return bool((int(row[i >> 5]) >> (i & 31)) & 1)


def walk(vocab: Vocab, constraint, markers: list[list[int]], rng: np.random.Generator, max_steps: int,
         reasoning_end: list[int] | None = None, closing: list[list[int]] = (), jump_after: int | None = None):
    """Returns (token ids, finished) where finished means terminated or an end-of-turn token.
    `jump_after` (a token id: the prompt's last): jump-forward as the engine does it, after that token and
    after every chosen one, the forced text's tokens (`forced_token_ids`) taken without choosing."""
    n = vocab.engine.vocab_size
    row = np.zeros((n + 31) // 32, dtype=np.int32)
    closers = vocab.closers()
    ids: list[int] = []
    queue: list[int] = []
    if jump_after is not None and _jump(vocab, constraint, jump_after, ids):
        return ids, True
    while len(ids) < max_steps:
        if constraint.is_terminated():
            return ids, True
        constraint.fill_mask(row)
        if queue and _bit(row, queue[0]):
            token = queue.pop(0)
        else:
            queue = _closing(vocab, constraint, row, closing, rng) if len(ids) >= LATE and rng.random() < P_LATE else []
            if queue:
                token = queue.pop(0)
            else:
                token = _step(vocab, constraint, row, markers, closers, ids, rng, reasoning_end, queue)
        assert constraint.accept(token), f"accepted token {token} rejected after {vocab.decode(ids)!r}"
        ids.append(token)
        if token in vocab.stops:
            return ids, True
        if jump_after is not None and _jump(vocab, constraint, token, ids):
            return ids, True
    return ids, False


def _jump(vocab: Vocab, constraint, prev: int, ids: list[int]) -> bool:
    """Append the tokens the grammar forces after `prev` (as the engine's jump-forward takes them); True when
    one of them ends the turn."""
    if constraint.is_terminated():
        return False
    for token in forced_token_ids(vocab.encode, vocab.decode, prev, constraint.forced_text()):
        if not constraint.accept_jumped(token):
            break
        ids.append(token)
        if token in vocab.stops:
            return True
    return False


def _step(vocab, constraint, row, markers, closers, ids, rng, reasoning_end, queue) -> int:
    """One early-phase step (uniform, or a marker / closing punctuation with the stated odds)."""
    n = vocab.engine.vocab_size
    allowed = np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[:n])
    assert allowed.size, f"empty mask after {vocab.decode(ids)!r}"
    r = rng.random()
    starts = [m for m in markers if _bit(row, m[0]) and _structural(vocab, constraint, m)] if r < P_MARKER else []
    if reasoning_end and not _in_reasoning(vocab, constraint, ids, reasoning_end):
        starts = [m for m in starts if m != reasoning_end]
    close = allowed[closers[allowed]] if P_MARKER <= r < P_MARKER + P_CLOSE else allowed[:0]
    ends = [m for m in starts if m[0] in vocab.stops]
    if ends and rng.random() < 0.5:
        starts = ends
    if starts:
        queue.extend(starts[rng.integers(len(starts))])
        return queue.pop(0)
    if close.size:
        return int(close[rng.integers(close.size)])
    return int(allowed[rng.integers(allowed.size)])


def _closing(vocab, constraint, row, closing, rng) -> list[int]:
    """A closing sequence the grammar accepts whole (one that ends a structure when there is one)."""
    fits, ends = [], []
    for seq in closing:
        if not _bit(row, seq[0]):
            continue
        text_follows = _text_follows(vocab, constraint, seq)
        if text_follows is None:
            continue
        fits.append(seq)
        if not text_follows:
            ends.append(seq)
    pick = ends or fits
    return list(pick[rng.integers(len(pick))]) if pick else []


def _text_follows(vocab: Vocab, constraint, seq: list[int]) -> bool | None:
    """None when the grammar rejects `seq`; else whether plain text (the canary) may follow it."""
    matcher = constraint.matcher.fork()
    if not all(matcher.accept_token(t) for t in seq):
        return None
    if matcher.is_terminated():
        return False
    row = np.zeros((vocab.engine.vocab_size + 31) // 32, dtype=np.int32)
    matcher.fill_next_token_bitmask(row.reshape(1, -1))
    return _bit(row, vocab.canary)


def _in_reasoning(vocab: Vocab, constraint, ids, end: list[int]) -> bool:
    """Whether the reasoning block is open (the reasoning end is only a marker there)."""
    n = len(end)
    closed = any(ids[i:i + n] == end for i in range(len(ids) - n + 1))
    return not closed and (constraint.prefill.startswith(constraint.reasoning_start) or bool(ids))


def _structural(vocab: Vocab, constraint, seq: list[int]) -> bool:
    """A single-token marker is always structural (the marker guard keeps it out of strings); a
    spelled-out one only when plain text cannot follow it (so not inside a string)."""
    return len(seq) == 1 or _text_follows(vocab, constraint, seq) is False


def marker_sequences(vocab: Vocab, spec) -> list[list[int]]:
    found = [spec.tool_start, spec.tool_end, spec.reasoning_end]
    if spec.kind == "harmony":
        found += ["<|start|>assistant", "<|channel|>final<|message|>"]
    seqs = [vocab.encode(m) for m in dict.fromkeys(m for m in found if m)]
    return [s for s in seqs if s] + [[t] for t in vocab.stops]


# Closing tags of the argument syntaxes, per format kind (besides the spec's markers).
_CLOSING_TAGS = {
    "qwen_xml": ("\n</parameter>", "</parameter>", "\n</function>", "</function>"),
    "gemma4": ('<|"|>',),
    "harmony": ("<|end|>", "<|return|>", "<|call|>"),
    "deepseek_v3": ("\n```<｜tool▁call▁end｜>", "<｜tool▁call▁end｜>"),
}


def closing_sequences(vocab: Vocab, spec) -> list[list[int]]:
    """Token sequences that close something: JSON/Python closers, end markers, end-of-turn tokens."""
    found = ['"', "'", "}", "]", ")", spec.tool_end, spec.reasoning_end, *_CLOSING_TAGS.get(spec.kind, ())]
    seqs = [vocab.encode(m) for m in dict.fromkeys(m for m in found if m)]
    return [s for s in seqs if s] + [[t] for t in vocab.stops]


def output_text(vocab: Vocab, ids: list[int]) -> str:
    """The generated text as the parser sees it: xgrammar's stop tokens are not text."""
    xgr_stops = set(vocab.engine.xgr_stop_token_ids)
    return vocab.decode([i for i in ids if i not in xgr_stops])


def dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False)
