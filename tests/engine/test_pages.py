"""The KV pool's bookkeeping (`engine.pages.PagePool`): allocation and release, the hash chain that keys full
pages by the whole prefix they end, least-recently-released eviction, and a random walk of requests that keeps
every count consistent."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxchat.engine.pages import PagePool


def test_pages_are_handed_out_once_and_come_back():
    pool = PagePool(6, 4)
    assert pool.capacity == 5 and pool.available() == 5
    a = pool.allocate(3)
    assert len(set(a)) == 3 and 0 not in a  # page 0 is the padding page
    assert pool.allocate(3) is None and pool.available() == 2  # a refusal takes nothing
    b = pool.allocate(2)
    assert not set(a) & set(b) and pool.used() == 5
    pool.release(a)
    assert pool.used() == 2
    with pytest.raises(RuntimeError, match="released more often"):
        pool.release(a[:1])


def test_a_key_names_the_whole_prefix_up_to_its_page():
    pool = PagePool(16, 4)
    first = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    pages = pool.allocate(3)
    done = pool.register(pages, first)  # two full pages are keyed, the third holds one token
    assert done[0] == 2 and pool.cached() == 2
    assert pool.match([1, 2, 3, 4, 5, 6, 7, 8, 0, 0], limit=9) == pages[:2]
    assert pool.match([1, 2, 3, 4, 0, 0, 0, 0], limit=9) == pages[:1]  # the second page's tokens differ
    assert pool.match([0, 2, 3, 4, 5, 6, 7, 8], limit=9) == []  # same second page, another first: no match
    assert pool.match(first, limit=1) == pages[:1]  # at most `limit` pages
    assert pool.refs[pages[0]] == 4 and pool.refs[pages[1]] == 2 and pool.hits == 4


def test_registering_in_steps_continues_the_chain():
    whole, parts = PagePool(16, 4), PagePool(16, 4)
    tokens = list(range(100, 117))
    a, b = whole.allocate(5), parts.allocate(5)
    whole.register(a, tokens)
    done = None
    for n in (3, 5, 9, 9, 16, 17):
        done = parts.register(b, tokens[:n], done)
    assert done[0] == 4
    probe = tokens + [0]
    assert len(whole.match(probe, 9)) == len(parts.match(probe, 9)) == 4


def test_released_keyed_pages_stay_cached_until_evicted_oldest_first():
    pool = PagePool(5, 2)
    x, y = pool.allocate(2), pool.allocate(2)
    pool.register(x, [1, 1, 2, 2])
    pool.register(y, [3, 3, 4, 4])
    pool.release(x)
    pool.release(y)
    assert pool.used() == 0 and pool.available() == 4 and pool.cached() == 4
    assert pool.match([3, 3, 4, 4, 9], 2) == y  # held again: out of the LRU list
    fresh = pool.allocate(2)  # no free page left: evicts x's pages (released first), not y's (held)
    assert set(fresh) == set(x) and pool.cached() == 2
    assert pool.match([1, 1, 2, 2], 2) == []
    pool.release(fresh)
    assert pool.allocate(3) is None


def test_a_duplicate_page_is_not_keyed_and_no_cache_keys_nothing():
    pool = PagePool(8, 2)
    a, b = pool.allocate(1), pool.allocate(1)
    pool.register(a, [5, 6])
    pool.register(b, [5, 6])  # the same prefix in another page: the first keeps the key
    assert pool.cached() == 1
    pool.release(b)
    assert pool.available() == 6  # b went straight back to the free list
    off = PagePool(8, 2, prefix_caching=False)
    c = off.allocate(1)
    off.register(c, [5, 6])
    assert off.cached() == 0 and off.match([5, 6, 7], 2) == []


def test_reset_forgets_keys_but_not_pages_in_use():
    pool = PagePool(8, 2)
    held, idle = pool.allocate(1), pool.allocate(1)
    pool.register(held, [1, 2])
    pool.register(idle, [3, 4])
    pool.release(idle)
    pool.reset_cache()
    assert pool.cached() == 0 and pool.used() == 1 and pool.available() == 6
    assert pool.match([1, 2, 3], 1) == []


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(["start", "grow", "end"]), st.integers(0, 5), st.integers(1, 9)),
                max_size=60))
def test_random_requests_keep_the_counts_consistent(actions):
    """Requests start (matching their prompt's cached pages), grow and end in any order: a page is held by as
    many requests as its reference count says, a held page is never handed out again, and pages only ever move
    between held, cached and free."""
    pool = PagePool(20, 2)
    held: dict[int, tuple[list[int], list[int]]] = {}  # request -> (its pages, its tokens)
    for action, rid, n in actions:
        if action == "start" and rid not in held:
            tokens = [rid % 2] * n  # two families of prompts that share prefixes
            pages = pool.match(tokens, (n - 1) // 2)
            more = pool.allocate(pool.pages_for(n) - len(pages))
            if more is None:
                pool.release(pages)
                continue
            held[rid] = (pages + more, tokens)
        elif action == "grow" and rid in held:
            pages, tokens = held[rid]
            tokens += [7] * n
            more = pool.allocate(pool.pages_for(len(tokens)) - len(pages))
            if more is None:
                tokens[:] = tokens[:-n]
                continue
            pages += more
            pool.register(pages, tokens)
        elif action == "end" and rid in held:
            pages, tokens = held.pop(rid)
            pool.register(pages, tokens)
            pool.release(pages)
        refs = {}
        for pages, _ in held.values():
            for p in pages:
                refs[p] = refs.get(p, 0) + 1
        assert all(pool.refs[p] == c for p, c in refs.items())
        assert pool.used() == len(refs)
        assert pool.used() + pool.available() == pool.capacity
