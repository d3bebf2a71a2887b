"""Speculative decoding with prompt-lookup drafts: the draft index and length policy; in the engine, greedy outputs
identical with and without drafts (constraints from real grammars with a mask at every drafted position, stop
strings, penalties, max_tokens), a draft the grammar rejects mid-way, and sampled tokens that follow the
model's own distribution (a chi-squared test)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxchat.chat import chat_constraint_request_from_openai, chat_format_make
from jaxchat.engine.drafts import STOP_AFTER, DraftLength, NgramIndex
from jaxchat.engine.engine import Engine
from jaxchat.engine.types import GenerationRequest, SamplingParams
from tests.engine.helpers import FakeModel, byte_tokenizer

TOK = byte_tokenizer()
EOS = TOK.convert_tokens_to_ids("<|im_end|>")
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {"type": "array", "items": {
    "type": "string"}}, "n": {"type": "integer"}}, "required": ["name", "tags"]}
TOOLS = [{"type": "function", "function": {"name": "edit", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "text": {"type": "string"}, "line": {"type": "integer"}},
    "required": ["path", "text"]}}},
    {"type": "function", "function": {"name": "look", "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}}, "required": ["query"]}}}]
BODIES = {
    "none": None,
    "json_schema": {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}},
    "required": {"tools": TOOLS, "tool_choice": "required"},
    "named": {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "edit"}}},
    "auto": {"tools": TOOLS},
}


def test_ngram_index_proposes_what_followed_the_latest_longest_match():
    index = NgramIndex(max_n=3, min_n=2)
    tokens = [1, 2, 3, 4, 5, 9, 2, 3, 7, 1, 2, 3]
    assert index.propose(tokens, 3) == [4, 5, 9]  # the longest match, "1 2 3" at 0..2 (not "2 3" at 6..7)
    tokens = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    assert NgramIndex(max_n=3, min_n=2).propose(tokens, 4) == [4, 5, 9, 1]
    assert NgramIndex().propose([5, 6, 7, 8], 4) == []  # no repeat
    grown = NgramIndex(max_n=2, min_n=2)
    seq = [4, 4, 8, 4]
    assert grown.propose(seq, 2) == []  # (8, 4) was not seen before
    seq += [4]
    assert grown.propose(seq, 2) == [8, 4]  # (4, 4) ended at index 1


def test_draft_length_grows_shrinks_and_pauses():
    length = DraftLength(6)
    assert length.active and length.k == 6
    length.verified(6, 6)
    assert length.k == 6
    length.verified(6, 2)
    assert length.k == 4
    length.verified(4, 4)
    assert length.k == 6
    for _ in range(STOP_AFTER):
        length.verified(length.k, 0)
    assert not length.active
    while not length.active:
        length.tick()
    assert length.k == 2


@pytest.fixture(scope="module")
def engines():
    from jaxchat.constrain import GrammarEngine

    # every program compiled up front (the verify step too: under the test run's first set alone no row drafts)
    shapes = {"max_batch": 4, "max_context": 128, "max_step_tokens": 64, "start": False, "programs": "all"}
    on = Engine(FakeModel(TOK, eos=(EOS,)), **shapes, speculative="ngram", draft_tokens=5)
    off = Engine(FakeModel(TOK, eos=(EOS,)), **shapes, speculative="off")
    grammar = GrammarEngine(TOK, vocab_size=320, stop_token_ids=[EOS])
    yield on, off, grammar
    on.shutdown()
    off.shutdown()


def constraint(grammar, kind):
    body = BODIES[kind]
    if body is None:
        return None
    request = chat_constraint_request_from_openai({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                                   **body})
    return grammar.make(chat_format_make("hermes_json"), request, "")


def run(engine, grammar, requests):
    sched = engine.scheduler
    got = {i: [] for i in range(len(requests))}
    for i, (prompt, sampling, kind) in enumerate(requests):
        sched.submit(GenerationRequest(TOK.encode(prompt), sampling, constraint(grammar, kind), str(i)),
                     got[i].append)
    while engine.core.has_work():
        engine.core.step()
    return {i: ([t for o in outs for t in o.token_ids], "".join(o.text for o in outs), outs[-1].finish_reason)
            for i, outs in got.items()}


COPY = ['def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return a + b\n',
        '{"name": "x", "tags": ["a", "b"]} {"name": "x", "tags": ["a", "b"]} {"name": "x"',
        "abcabcabcabcabcabc", "the cat sat on the mat. the cat sat on the", "zzz"]

request = st.tuples(
    st.sampled_from(COPY),
    st.builds(SamplingParams, max_tokens=st.integers(1, 40), ignore_eos=st.booleans(),
              repetition_penalty=st.sampled_from([1.0, 1.0, 1.3]), frequency_penalty=st.sampled_from([0.0, 0.0, 0.5]),
              stop=st.sampled_from([(), (), ("a",), ("\n",)])),
    st.sampled_from(list(BODIES)),
)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(request, min_size=1, max_size=4))
def test_greedy_outputs_identical_with_and_without_drafts(engines, requests):
    on, off, grammar = engines
    assert run(on, grammar, requests) == run(off, grammar, requests)


def test_copying_requests_accept_drafts_and_take_fewer_steps(engines):
    on, off, grammar = engines
    requests = [(COPY[0], SamplingParams(max_tokens=40, ignore_eos=True), "none")]  # its output cycles
    drafted, accepted = on.scheduler.speculator.drafted, on.scheduler.speculator.accepted
    steps_on, steps_off = on.scheduler.steps, off.scheduler.steps
    assert run(on, grammar, requests) == run(off, grammar, requests)
    assert on.scheduler.speculator.drafted > drafted and on.scheduler.speculator.accepted > accepted
    assert on.scheduler.steps - steps_on < off.scheduler.steps - steps_off
    stats = on.stats()
    assert stats.draft_tokens >= stats.draft_accepted_tokens > 0


def test_a_draft_the_grammar_rejects_midway_is_cut_and_the_output_is_unchanged(engines, monkeypatch):
    """Drafts made of the tokens decoding without drafts writes, with one token the JSON schema's grammar does
    not allow in the middle: `draft_masks` cuts the draft before it, the masks up to there are the grammar's
    own, the tokens before it are accepted, and the output is that of decoding without drafts."""
    on, off, grammar = engines
    prompt, sampling = "a json record please: ", SamplingParams(max_tokens=24, ignore_eos=True)
    want = run(off, grammar, [(prompt, sampling, "json_schema")])
    written = want[0][0]
    n_prompt = len(TOK.encode(prompt))

    def probe(upto: int):
        c = constraint(grammar, "json_schema")
        for t in written[:upto]:
            assert c.accept(t)
        return c

    def disallowed(at: int) -> int:
        row = np.zeros(on.runner.mask_words, np.int32)
        probe(at).fill_mask(row)
        return next(t for t in range(32, 300) if not (int(row[t >> 5]) >> (t & 31)) & 1)

    def propose(self, tokens, k):
        m = len(tokens) - n_prompt  # tokens written so far
        if m + 4 > len(written):
            return []
        return [*written[m:m + 2], disallowed(m + 2), *written[m + 3:m + 5]][:max(k, 3)]

    from jaxchat.constrain.constraint import GrammarConstraint
    from jaxchat.engine.drafts import NgramIndex

    original, cuts = GrammarConstraint.draft_masks, []

    def recording(self, drafts, masks):
        n = original(self, drafts, masks)
        at = len(self.history)
        for j in range(n + 1):  # the mask at each admitted position is the grammar's after the drafts before it
            row = np.zeros(masks.shape[1], np.int32)
            probe(at + j).fill_mask(row)
            assert np.array_equal(row, masks[j])
        cuts.append((len(drafts), n))
        return n

    monkeypatch.setattr(NgramIndex, "propose", propose)
    monkeypatch.setattr(GrammarConstraint, "draft_masks", recording)
    accepted = on.scheduler.speculator.accepted
    assert run(on, grammar, [(prompt, sampling, "json_schema")]) == want
    assert cuts and all(n == 2 for drafted, n in cuts if drafted > 2), cuts  # cut at the disallowed token
    assert on.scheduler.speculator.accepted - accepted >= 2  # the drafts before it were the model's own


def test_sampling_with_drafts_follows_the_models_distribution(engines, monkeypatch):
    """Temperature 1, top-k 6: 600 requests without drafts and 600 with (other seeds, so the two samples are
    independent). The drafts are fixed: at each of the second and third tokens, the most frequent token of the
    samples without drafts, so they are accepted some of the time and rejected the rest. The second and
    third output tokens' distributions must agree: a chi-squared test of homogeneity, p > 0.01 for each."""
    from scipy.stats import chi2_contingency

    from jaxchat.engine.drafts import NgramIndex

    _, _, grammar = engines
    model = FakeModel(TOK, eos=(EOS,))
    model.params["head"] = model.params["head"] * 0.3  # flatter logits: several likely tokens at each position
    shapes = {"max_batch": 4, "max_context": 64, "step_token_buckets": (16,), "decode_rows": (4,), "start": False,
              "warmup": False}
    on, off = Engine(model, **shapes, speculative="ngram", draft_tokens=2), Engine(model, **shapes, speculative="off")
    prompt, n = "abcabcabcabcabc", 600

    def outputs(engine, first_seed):
        out = []
        for seed in range(first_seed, first_seed + n):  # one at a time: no other row's prompt takes the step
            req = (prompt, SamplingParams(max_tokens=4, temperature=1.0, top_k=6, seed=seed, ignore_eos=True), "none")
            out += [tokens for tokens, _, _ in run(engine, grammar, [req]).values()]
        return out

    without = outputs(off, 0)
    drafts = []
    for index in (1, 2):
        column = [o[index] for o in without]
        drafts.append(max(set(column), key=column.count))
    monkeypatch.setattr(NgramIndex, "propose", lambda self, tokens, k: drafts[:k])
    drafted, accepted = on.scheduler.speculator.drafted, on.scheduler.speculator.accepted
    with_drafts = outputs(on, 10_000)
    assert on.scheduler.speculator.drafted - drafted >= n
    assert 0 < on.scheduler.speculator.accepted - accepted < on.scheduler.speculator.drafted - drafted
    on.shutdown()
    off.shutdown()
    for index in (1, 2):
        a, b = [o[index] for o in with_drafts], [o[index] for o in without]
        values = [v for v in sorted(set(a) | set(b)) if a.count(v) + b.count(v) >= 5]
        table = np.array([[a.count(v) for v in values], [b.count(v) for v in values]])
        assert table.shape[1] >= 3, table
        assert chi2_contingency(table).pvalue > 0.01, (index, table)


@pytest.mark.parametrize("overlap", [True, False])
def test_a_row_whose_drafts_keep_failing_pauses_then_drafts_again(engines, monkeypatch, overlap):
    """Drafts the model never takes: after `STOP_AFTER` misses the row stops drafting for a pause counted in its
    decoded tokens, in the overlapped loop too (where its tokens are fed from the device), then drafts again."""
    from jaxchat.engine.drafts import FIRST_PAUSE, NgramIndex
    from jaxchat.engine.speculate import Speculator

    on, off, grammar = engines
    prompt, sampling = "abcabcabc", SamplingParams(max_tokens=3 * STOP_AFTER + FIRST_PAUSE + 8, ignore_eos=True)
    written = run(off, grammar, [(prompt, sampling, "none")])[0][0]
    n_prompt = len(TOK.encode(prompt))
    monkeypatch.setattr(NgramIndex, "propose",  # the token after the model's own: never accepted
                        lambda self, tokens, k: [(written[len(tokens) - n_prompt] + 1) % 256]
                        if len(tokens) - n_prompt < len(written) else [])
    original, verifications = Speculator.verified, []

    def counting(self, seq, row, tokens):
        verifications.append(seq.generated)
        return original(self, seq, row, tokens)

    monkeypatch.setattr(Speculator, "verified", counting)
    monkeypatch.setattr(on.core, "overlap", overlap)
    assert run(on, grammar, [(prompt, sampling, "none")])[0][0] == written
    assert len(verifications) > STOP_AFTER, verifications  # it drafted again after the pause
    assert verifications[STOP_AFTER] - verifications[STOP_AFTER - 1] >= FIRST_PAUSE  # after a pause
