"""The jitted masked sampler: never emits a disallowed token, for any masks and sampling parameters."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxchat.engine.compiles import compile_count
from jaxchat.engine.sampler import SamplingArrays, sample, unpack_bitmask

B, V, VALID = 4, 100, 97  # ids 97..99 are vocabulary padding
W = (V + 31) // 32

_masked = jax.jit(lambda lg, bm, c, pm, sp: sample(lg, bm, c, pm, sp, VALID))
_unmasked = jax.jit(lambda lg, c, pm, sp: sample(lg, None, c, pm, sp, VALID))


def _pack(allowed: np.ndarray) -> np.ndarray:
    padded = np.zeros((allowed.shape[0], W * 32), bool)
    padded[:, : allowed.shape[1]] = allowed
    words = (padded.reshape(allowed.shape[0], W, 32).astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(-1)
    return words.astype(np.uint32).view(np.int32)


def _params(draw_f, rows: int) -> SamplingArrays:
    sp = SamplingArrays.numpy(rows)
    return sp._replace(**{k: np.asarray(v, dtype=getattr(sp, k).dtype) for k, v in draw_f.items()})


row_params = st.fixed_dictionaries({
    "temperature": st.sampled_from([0.0, 0.3, 1.0, 2.5]),
    "top_p": st.sampled_from([1.0, 0.9, 0.5, 0.01]),
    "top_k": st.sampled_from([0, 1, 3, 50]),
    "min_p": st.sampled_from([0.0, 0.05, 0.5]),
    "presence": st.sampled_from([0.0, 1.5, -1.0]),
    "frequency": st.sampled_from([0.0, 0.7]),
    "repetition": st.sampled_from([1.0, 1.3, 0.8]),
    "seed": st.integers(0, 2**32 - 1),
    "step": st.integers(0, 1000),
    "logprobs": st.booleans(),
})


def test_unpack_bitmask_matches_pack():
    r = np.random.default_rng(0)
    allowed = r.random((B, V)) < 0.3
    got = np.asarray(unpack_bitmask(_pack(allowed), V, VALID))
    assert (got == (allowed & (np.arange(V) < VALID))).all()


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(row_params, min_size=B, max_size=B),
    density=st.lists(st.sampled_from([0.0, 0.01, 0.1, 0.5, 1.0]), min_size=B, max_size=B),
    seed=st.integers(0, 2**31 - 1),
)
def test_never_emits_a_disallowed_token(rows, density, seed):
    r = np.random.default_rng(seed)
    allowed = r.random((B, V)) < np.asarray(density)[:, None]
    allowed[np.arange(B), r.integers(0, VALID, B)] = True  # every row allows something
    logits = (r.normal(size=(B, V)) * 5).astype(np.float32)
    counts = r.integers(0, 3, (B, V)).astype(np.int32)
    pmask = r.random((B, V)) < 0.2
    sp = _params({k: [row[k] for row in rows] for k in rows[0]}, B)
    out = _masked(logits, _pack(allowed), counts, pmask, sp)
    toks = np.asarray(out.tokens)
    assert (toks < VALID).all()
    assert allowed[np.arange(B), toks].all(), (toks, rows)
    # an all-ones mask is exactly the unmasked sampler
    ones = np.full((B, W), -1, np.int32)
    a = _masked(logits, ones, counts, pmask, sp)
    b = _unmasked(logits, counts, pmask, sp)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_greedy_is_argmax_and_nan_row_falls_back_to_an_allowed_token():
    r = np.random.default_rng(1)
    logits = r.normal(size=(B, V)).astype(np.float32)
    logits[1] = np.nan
    logits[2, 5] = np.nan  # one NaN entry, allowed
    allowed = np.zeros((B, V), bool)
    allowed[:, [5, 7, 11]] = True
    allowed[0] = True
    sp = SamplingArrays.numpy(B)
    zeros, nomask = np.zeros((B, V), np.int32), np.zeros((B, V), bool)
    toks = np.asarray(_masked(logits, _pack(allowed), zeros, nomask, sp).tokens)
    assert toks[0] == np.argmax(logits[0, :VALID])
    assert toks[1] in (5, 7, 11)
    assert toks[2] in (5, 7, 11)
    assert toks[3] == [5, 7, 11][int(np.argmax(logits[3, [5, 7, 11]]))]
    sp = sp._replace(temperature=np.full(B, 1.0, np.float32))
    toks = np.asarray(_masked(logits, _pack(allowed), zeros, nomask, sp).tokens)
    assert allowed[np.arange(B), toks].all()


def test_seeded_sampling_is_reproducible_and_params_do_not_recompile():
    r = np.random.default_rng(2)
    logits = np.tile(r.normal(size=(1, V)).astype(np.float32) * 3, (B, 1))
    zeros, nomask, ones = np.zeros((B, V), np.int32), np.zeros((B, V), bool), np.full((B, W), -1, np.int32)
    sp = SamplingArrays.numpy(B)._replace(temperature=np.full(B, 1.0, np.float32), seed=np.full(B, 7, np.uint32))
    _masked(logits, ones, zeros, nomask, sp)
    before = compile_count()
    a = np.asarray(_masked(logits, ones, zeros, nomask, sp).tokens)
    assert (a == a[0]).all()  # same seed, same step, same logits: same draw in every row
    b = np.asarray(_masked(logits, ones, zeros, nomask, sp._replace(step=np.arange(B, dtype=np.int32))).tokens)
    assert b[0] == a[0]
    for t in (0.0, 0.5):
        _masked(logits, ones, zeros, nomask, sp._replace(temperature=np.full(B, t, np.float32),
                                                         top_k=np.full(B, 3, np.int32)))
    assert compile_count() == before


def test_penalties():
    logits = np.zeros((1, V), np.float32)
    logits[0, 3], logits[0, 4] = 2.0, 1.9
    counts = np.zeros((1, V), np.int32)
    counts[0, 3] = 1
    ones, nomask = np.full((1, W), -1, np.int32), np.zeros((1, V), bool)
    sp = SamplingArrays.numpy(1)
    assert int(_masked(logits, ones, counts, nomask, sp).tokens[0]) == 3
    for field, val in (("presence", 0.5), ("frequency", 0.5), ("repetition", 1.2)):
        sp2 = sp._replace(**{field: np.full(1, val, np.float32)})
        assert int(_masked(logits, ones, counts, nomask, sp2).tokens[0]) == 4, field
    pm = nomask.copy()
    pm[0, 3] = True
    sp2 = sp._replace(repetition=np.full(1, 1.2, np.float32))
    assert int(_masked(logits, ones, np.zeros_like(counts), pm, sp2).tokens[0]) == 4


def _reference_truncation(y: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """The textbook definition with a full sort: keep the top_k largest, then the smallest prefix of the
    sorted distribution whose probability mass reaches top_p."""
    keep = np.isfinite(y)
    if top_k > 0:
        kth = np.sort(y[keep])[::-1][min(top_k, keep.sum()) - 1]
        keep &= y >= kth
    z = np.where(keep, y, -np.inf)
    probs = np.exp(z - z.max())
    probs /= probs.sum()
    if top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]
        n = max(int(np.sum(before < top_p)), 1)
        keep &= probs >= probs[order][n - 1]
    return keep


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), top_k=st.sampled_from([0, 1, 5, 40]), top_p=st.sampled_from([1.0, 0.95, 0.5, 0.1]),
       masked=st.floats(0.0, 0.9))
def test_top_k_top_p_cut_matches_a_full_sort(seed, top_k, top_p, masked):
    from jaxchat.engine.sampler import _truncate

    rng = np.random.default_rng(seed)
    y = (rng.standard_normal((3, 1000)) * 3).astype(np.float32)
    y[rng.random(y.shape) < masked] = -np.inf
    y[:, 0] = 1.0  # at least one allowed token per row
    params = SamplingArrays.numpy(3)._replace(top_k=np.full(3, top_k, np.int32), top_p=np.full(3, top_p, np.float32))
    kept = np.isfinite(np.asarray(_truncate(jnp.asarray(y), params)))
    for row in range(3):
        np.testing.assert_array_equal(kept[row], _reference_truncation(y[row], top_k, top_p))


def test_row_argmax_matches_jnp_argmax_on_large_vocabularies():
    """The two-level argmax gives jnp.argmax's answer with NaN read as -inf: first maximum, all -inf -> 0,
    for a vocabulary with a block divisor and for one that must be padded."""
    from jaxchat.engine.sampler import row_argmax

    rng = np.random.default_rng(0)
    for vocab in (49152, 151936, 5003):
        x = rng.standard_normal((6, vocab)).astype(np.float32)
        x[1, [17, vocab - 3]] = 9.0  # a tie: the first one wins
        x[2, vocab - 1] = 9.0  # the maximum in the last (possibly padded) block
        x[3, [40, 4000]] = np.nan
        x[4] = -np.inf
        x[5, 1234:1300] = 50.0
        got = np.asarray(jax.jit(row_argmax)(jnp.asarray(x)))
        expected = np.asarray(jnp.argmax(jnp.asarray(np.where(np.isnan(x), -np.inf, x)), axis=-1))
        np.testing.assert_array_equal(got, expected)


def test_large_vocabulary_sampling_stays_inside_the_mask():
    """With a vocabulary big enough for the blocked argmax, greedy and sampled rows still only pick
    allowed tokens."""
    vocab = 8192
    words = vocab // 32
    rng = np.random.default_rng(1)
    allowed = rng.random((4, vocab)) < 0.01
    allowed[:, 5] = True
    padded = (allowed.reshape(4, words, 32).astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(-1)
    bitmask = padded.astype(np.uint32).view(np.int32)
    logits = rng.standard_normal((4, vocab)).astype(np.float32) * 5
    sp = SamplingArrays.numpy(4)._replace(temperature=np.array([0.0, 1.0, 0.7, 1.5], np.float32),
                                           top_p=np.array([1.0, 0.9, 1.0, 0.5], np.float32),
                                           top_k=np.array([0, 0, 40, 0], np.int32))
    run = jax.jit(lambda lg, bm, c, pm, s: sample(lg, bm, c, pm, s, vocab))
    for step in range(8):
        out = run(logits, bitmask, np.zeros((4, vocab), np.int32), np.zeros((4, vocab), bool),
                  sp._replace(step=np.full(4, step, np.int32), seed=np.arange(4, dtype=np.uint32)))
        toks = np.asarray(out.tokens)
        assert allowed[np.arange(4), toks].all(), toks
        greedy = np.where(allowed[0], logits[0], -np.inf).argmax()
        assert toks[0] == greedy
