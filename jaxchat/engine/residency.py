"""Which requests hold a slot and KV pages: admission, growth under pressure, prefix keys, release (no JAX).

Contract (`Residency(pool, max_batch, token_handler)`, one per scheduler; the scheduler decides *when*, this decides
*what each request holds*):
- `running` (admission order) hold a slot and pages; `waiting` (a deque, arrival order, preempted requests back
  at its front) hold neither; `free_slots` pop the lowest slot first. These collections are mutated in place,
  never rebound.
- `admit(seq)`: the request at the head of `waiting` (opened already, see `tokens.TokenHandler.open`) gets a slot
  and the pages of all its tokens, the longest cached run of full pages mapped from the prefix cache (at least
  its last token is run: its logits give the next one; none for a request with a repetition penalty, only prompt
  pages with presence/frequency penalties), counted in `num_cached_tokens` / `prefix_hit_tokens` on its first
  admission. False when the pages cannot be had yet (it stays first); a request that can never fit is finished
  with "error" (True: it leaves the queue). The caller pops it from `waiting`.
- `ensure_pages(seq, upto, rows)`: extend a running request's pages to cover positions < upto, preempting the
  newest running request while none can be had (its pages released, their full pages staying cached; its slot
  freed; back at the front of `waiting`, its epoch bumped so steps planned before speak no more for it; dropped
  from `rows`). False when the request itself was preempted, or finished with "length" because it alone needs
  more pages than the pool holds.
- `key_pages(rows)`: key the rows' full pages whose tokens are known in the prefix cache. `sweep()`: release
  the slots and pages of finished requests and drop finished ones from `waiting`.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from jaxchat.engine.pages import PagePool
from jaxchat.engine.plan import PlannedRow
from jaxchat.engine.sequence import Sequence
from jaxchat.engine.tokens import TokenHandler


class Residency:
    def __init__(self, pool: PagePool, max_batch: int, token_handler: TokenHandler) -> None:
        self.pool, self.token_handler = pool, token_handler
        self.free_slots = list(range(max_batch))[::-1]  # pop() gives the lowest slot
        self.running: list[Sequence] = []
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.prefix_hit_tokens = 0
        self.preemptions = 0

    def admit(self, seq: Sequence) -> bool:
        ps = self.pool.page_size
        first = seq.preempted == 0
        tokens = seq.tokens
        s = seq.req.sampling
        limit = (len(tokens) - 1) // ps  # the last token is always run: its logits give the next one
        if s.repetition_penalty != 1.0:
            limit = 0  # its prompt mask is built from the tokens a step runs
        elif s.presence_penalty or s.frequency_penalty:
            limit = min(limit, len(seq.prompt) // ps)  # outputs are counted as they are run
        total = self.pool.pages_for(len(tokens))
        if total > self.pool.capacity:
            self.token_handler.finish(seq, "error", error=f"prompt_ids: {len(tokens)} tokens need {total} pages of {ps}; "
                                                   f"the KV pool holds {self.pool.capacity}")
            return True
        matched = self.pool.match(tokens, limit)
        pages = self.pool.allocate(total - len(matched))
        if pages is None:
            self.pool.release(matched)
            return False
        seq.pages, seq.keyed = matched + pages, None
        seq.computed = len(matched) * ps
        if first:
            seq.cached = seq.computed
            self.prefix_hit_tokens += seq.computed
        seq.slot, seq.fresh = self.free_slots.pop(), True
        self.running.append(seq)
        self.token_handler.start(seq, recompute=not first)
        return True

    def ensure_pages(self, seq: Sequence, upto: int, rows: list[PlannedRow]) -> bool:
        need = self.pool.pages_for(upto) - len(seq.pages)
        while need > 0:
            got = self.pool.allocate(need)
            if got is not None:
                seq.pages += got
                return True
            victim = max((s for s in self.running if not s.finished and s.slot >= 0), key=lambda s: s.arrival)
            if victim is seq and len([s for s in self.running if not s.finished]) == 1:
                self.token_handler.finish(seq, "length")  # alone, and the pool is still too small for it
                return False
            self.preempt(victim)
            rows[:] = [row for row in rows if row.seq is not victim]
            if victim is seq:
                return False
        return True

    def preempt(self, seq: Sequence) -> None:
        self.pool.release(seq.pages)
        self.free_slots.append(seq.slot)
        self.running.remove(seq)
        seq.pages, seq.keyed, seq.slot = [], None, -1
        seq.computed, seq.pending, seq.fresh = 0, [], True
        seq.inflight = seq.fed = False
        seq.epoch += 1
        seq.preempted += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)

    def key_pages(self, rows: Iterable[PlannedRow]) -> None:
        """Key the rows' full pages whose tokens are known (their K/V is written by a step already dispatched: a
        later step that maps them runs after it)."""
        if not self.pool.prefix_caching:
            return
        ps = self.pool.page_size
        for seq, _, epoch in rows:
            if seq.finished or seq.epoch != epoch:
                continue
            known = min(seq.computed, len(seq.prompt) + len(seq.out_ids))
            if known // ps > (seq.keyed or (0,))[0]:
                seq.keyed = self.pool.register(seq.pages, seq.tokens[:known], seq.keyed)

    def sweep(self) -> None:
        for seq in [seq for seq in self.running if seq.finished]:
            self.running.remove(seq)
            self.pool.release(seq.pages)
            self.free_slots.append(seq.slot)
            seq.pages, seq.slot = [], -1
        if any(seq.finished for seq in self.waiting):
            kept = [seq for seq in self.waiting if not seq.finished]
            self.waiting.clear()
            self.waiting.extend(kept)
