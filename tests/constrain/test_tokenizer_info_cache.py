"""xgrammar's tokenizer info is kept on disk by content: a second start deserializes what the first computed."""

from __future__ import annotations


def test_the_tokenizer_info_is_kept_on_disk_by_content_and_equals_xgrammars_own(qwen25_tokenizer, tmp_path,
                                                                                  monkeypatch):
    import xgrammar as xgr

    from jaxchat.constrain import grammar_engine

    monkeypatch.setenv("JAXCHAT_CACHE", str(tmp_path))
    first, _, kept = grammar_engine.tokenizer_info(qwen25_tokenizer, 151936, None)
    (saved,) = (tmp_path / "xgrammar").glob("tokenizer-info-*.json")
    reference = xgr.TokenizerInfo.from_huggingface(qwen25_tokenizer, vocab_size=151936, stop_token_ids=kept)

    def refuse(*args, **kwargs):
        raise AssertionError("computed again")

    with monkeypatch.context() as patched:
        patched.setattr(xgr.TokenizerInfo, "from_huggingface", refuse)
        again, _, _ = grammar_engine.tokenizer_info(qwen25_tokenizer, 151936, None)
    assert again.serialize_json() == first.serialize_json() == reference.serialize_json()
    assert again.vocab_size == 151936 and list(again.stop_token_ids) == kept
    grammar_engine.tokenizer_info(qwen25_tokenizer, 152064, None)  # another vocab size: another key
    assert len(list((tmp_path / "xgrammar").glob("tokenizer-info-*.json"))) == 2
    saved.write_text("{damaged")  # an unreadable file is computed again, and replaced
    rebuilt, _, _ = grammar_engine.tokenizer_info(qwen25_tokenizer, 151936, None)
    assert rebuilt.serialize_json() == reference.serialize_json() == saved.read_text()
