"""Compile counts per owner: a `Tally` counts the compiles of the threads inside its block only, and an engine's
stats count its own warm-up and steps, not another engine's or the caller's compiles."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp

from jaxchat.engine.compiles import Tally, compile_count
from jaxchat.engine.engine import Engine
from tests.engine.helpers import FakeModel, byte_tokenizer

ONES = jnp.ones(3)  # built here, so the counted blocks compile only their own program


def compile_new_program(scale: float) -> None:
    jax.jit(lambda x: x * scale + 1.0)(ONES).block_until_ready()  # a new closure: one new compile


def test_a_tally_counts_only_its_own_threads():
    mine, other = Tally(), Tally()
    before = compile_count()
    with mine.counting():
        compile_new_program(2.0)

    def elsewhere():
        with other.counting():
            compile_new_program(3.0)
            compile_new_program(4.0)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    compile_new_program(5.0)  # counted by no tally
    assert (mine.compiles, other.compiles) == (1, 2)
    assert compile_count() - before == 4


def test_an_engine_counts_its_own_compiles_only():
    tok = byte_tokenizer()
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    with Engine(FakeModel(tok, eos=(eos,)), max_batch=2, max_context=32, start=False) as a:
        at_ready = a.stats()
        assert at_ready.compile_count > 0 and at_ready.compiles_on_request_path == 0
        with Engine(FakeModel(tok, eos=(eos,)), max_batch=2, max_context=32, start=False) as b:
            compile_new_program(6.0)
            assert b.stats().compile_count > 0
        assert a.stats().compile_count == at_ready.compile_count
        assert a.stats().compiles_on_request_path == 0
