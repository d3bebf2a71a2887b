"""`python -m jaxchat.prepare` (scripts/bootstrap.sh's step after the asset fetch): after it, a start's grammar
engine, built from the model as a start loads it, reads xgrammar's tokenizer info from disk instead of computing
it; unknown names are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

NAME = "smollm2-135m-instruct-q4_1.gguf"  # the smallest GGUF asset
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def fresh_grammar_cache(tmp_path, monkeypatch) -> Path:
    """A cache folder holding the fetched assets (linked) but no grammar-engine files."""
    from jaxchat.assets import cache_dir

    real = cache_dir()
    if not (real / NAME).exists():
        pytest.skip(f"{NAME} is not fetched (scripts/bootstrap.sh fetches it)")
    for entry in real.iterdir():
        if entry.name not in ("xgrammar", "jax-compilation-cache"):
            (tmp_path / entry.name).symlink_to(entry)
    monkeypatch.setenv("JAXCHAT_CACHE", str(tmp_path))
    return tmp_path / "xgrammar"


def test_after_prepare_a_starts_grammar_engine_reads_the_tokenizer_info_from_disk(fresh_grammar_cache, monkeypatch,
                                                                                    capsys):
    import xgrammar

    from jaxchat import prepare
    from jaxchat.assets import asset_path
    from jaxchat.constrain import GrammarEngine
    from jaxchat.models import load_model

    assert not fresh_grammar_cache.exists()
    assert prepare.main([NAME]) == 0
    assert f"{NAME}: grammar engine's tokenizer info ready" in capsys.readouterr().out
    assert len(list(fresh_grammar_cache.glob("tokenizer-info-*.json"))) == 1
    model = load_model(asset_path(NAME))  # the tokenizer and config exactly as a start has them

    def computed(*args, **kwargs):
        raise AssertionError("the tokenizer info was computed, not read")

    monkeypatch.setattr(xgrammar.TokenizerInfo, "from_huggingface", computed)
    engine = GrammarEngine(model.tokenizer, vocab_size=model.config.vocab_size)
    assert engine.tokenizer_info.vocab_size == model.config.vocab_size


def test_unknown_names_are_refused(capsys):
    from jaxchat import prepare

    assert prepare.main(["no-such.gguf"]) == 1
    assert "not a GGUF asset: no-such.gguf" in capsys.readouterr().err


def test_bootstrap_prepares_after_fetching():
    script = (ROOT / "scripts" / "bootstrap.sh").read_text()
    assert script.index("jaxchat.assets fetch") < script.index("python -m jaxchat.prepare")
