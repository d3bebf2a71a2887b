"""Program keys: the four kinds, their sampler, how many positions they sample, how they are spelled."""

from __future__ import annotations

from jaxchat.engine.program_catalogue import ProgramCatalogue
from jaxchat.engine.program_key import ProgramKey


def test_each_kind_names_its_tokens_rows_and_sampler():
    decode, ragged, verify = ProgramKey.decode(4), ProgramKey.ragged(64, 4), ProgramKey.verify(32, 4)
    assert (decode.kind, decode.tokens, decode.rows) == ("decode", 4, 4)
    assert (ragged.tokens, ragged.rows, ragged.samples) == (64, 4, 4)  # one sampled position per row
    assert verify.samples == 32 and verify.sampler() == ProgramKey.sample(32)  # every token of a verify step
    assert ragged.sampler() == decode.sampler() == ProgramKey.sample(4)
    assert [k.is_sampler for k in (decode, ragged, verify, ProgramKey.sample(4))] == [False, False, False, True]
    assert [k.name for k in (decode, ragged, verify, ProgramKey.sample(4))] == [
        "decode/4", "ragged/64/4", "verify/32/4", "sample/4"]
    assert ProgramKey.ragged(64.0, 4) == ragged and hash(ProgramKey.ragged(64, 4)) == hash(ragged)


def test_the_catalogue_lists_typed_keys_and_picks_one_for_a_step():
    catalogue = ProgramCatalogue(token_buckets=(16, 64), decode_rows=(1, 4), ragged_rows=(1, 4), verify_buckets=(16,),
                                 max_batch=4, prefix_reuse=True)
    keys = catalogue.program_keys()
    assert all(isinstance(k, ProgramKey) for k in keys)
    assert [k.name for k in keys] == ["decode/1", "decode/4", "ragged/16/1", "ragged/16/4", "ragged/64/1",
                                      "ragged/64/4", "verify/16/1", "verify/16/4", "sample/1", "sample/4",
                                      "sample/16"]
    assert catalogue.shape_for(3, 3) == ProgramKey.decode(4)
    assert catalogue.shape_for(2, 40) == ProgramKey.ragged(64, 4)
    assert catalogue.shape_for(2, 10, verify=True) == ProgramKey.verify(16, 4)
    assert catalogue.shape_for(5, 70) is None


def test_the_first_set_takes_a_middle_bucket_the_lower_one_on_cpu_while_the_others_come_in_the_background():
    def first(short_first: bool) -> list[str]:
        catalogue = ProgramCatalogue(token_buckets=(16, 64, 256, 512), decode_rows=(1, 2, 4, 8), ragged_rows=(8,),
                                     verify_buckets=(8,), max_batch=8, prefix_reuse=True, short_first=short_first)
        return [k.name for k in catalogue.first_keys()]

    assert first(False) == ["ragged/256/8", "decode/8", "sample/8"]  # accelerators, or the first set for good
    assert first(True) == ["ragged/64/8", "decode/8", "sample/8"]  # CPU: a short step must not pay 256 tokens

    def engine_first(programs: str) -> list[str]:
        from jaxchat.engine.engine import Engine
        from tests.engine.helpers import FakeModel, byte_tokenizer

        tok = byte_tokenizer()
        engine = Engine(FakeModel(tok, eos=(tok.convert_tokens_to_ids("<|im_end|>"),)), max_batch=8, max_context=512,
                        max_step_tokens=512, programs=programs, warmup=False, start=False)
        try:
            return [k.name for k in engine.runner.first_keys()]
        finally:
            engine.shutdown()

    assert engine_first("background")[0] == "ragged/64/8" and engine_first("first")[0] == "ragged/256/8"  # on CPU
