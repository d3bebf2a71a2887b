"""Incremental detokenisation and stop-string matching, one instance per request.

Contract:
- `IncrementalDetokenizer(tokenizer, prompt_ids)` turns generated token ids into text deltas whose
  concatenation equals `tokenizer.decode(generated, skip_special_tokens=False)` (modulo a prompt-dependent
  leading space that the prefix window handles): special tokens appear as their text; a partial UTF-8
  sequence (decoded as U+FFFD at the end of the window) is held back until the next token completes it;
  `flush()` releases whatever is still held when the request ends. Work per token is constant: only a short
  window of ids (`prefix_offset:`) is decoded, using the prefix-offset technique (decode the window with
  and without the new tokens and emit the difference), so SentencePiece leading-space handling stays right.
- `StopStringMatcher(stops)` consumes text deltas and returns `(emit, stop)`: text that can safely be
  emitted, holding back the longest suffix that could still begin a stop string; when a stop string
  completes, `stop` is that string and `emit` is the text before it (the stop string is never emitted).
  The result does not depend on how the text is chunked: the stop string that completes first wins.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_REPLACEMENT = "\ufffd"
_PROMPT_CONTEXT = 6  # prompt tokens kept as decoding context for the first generated token


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_ids: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        ctx = list(prompt_ids[-_PROMPT_CONTEXT:]) if prompt_ids else []
        self._ids: list[int] = ctx
        self._prefix_offset = 0
        self._read_offset = len(ctx)

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> str:
        """Append one generated token; return the newly completed text (possibly empty)."""
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(_REPLACEMENT):
            return ""  # an incomplete UTF-8 sequence (or nothing new yet): hold it back
        delta = full_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return delta

    def flush(self) -> str:
        """Release held-back text at the end of a request (incomplete sequences come out as U+FFFD)."""
        if self._read_offset >= len(self._ids):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return full_text.removeprefix(prefix_text)


class StopStringMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""

    def push(self, text: str) -> tuple[str, str | None]:
        if not self._stops:
            return text, None
        buf = self._held + text
        best: tuple[int, int, str] | None = None  # the stop string that completes first (then starts first)
        for s in self._stops:
            i = buf.find(s)
            if i >= 0 and (best is None or (i + len(s), i) < best[:2]):
                best = (i + len(s), i, s)
        if best is not None:
            self._held = ""
            return buf[: best[1]], best[2]
        hold = 0
        for s in self._stops:
            for k in range(min(len(s) - 1, len(buf)), hold, -1):
                if buf.endswith(s[:k]):
                    hold = k
                    break
        self._held = buf[len(buf) - hold :] if hold else ""
        return buf[: len(buf) - hold], None

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held
