"""`python -m jaxchat.models.prepare_assets` (run by `python -m jaxchat.prepare`, tests/test_prepare.py); what it
writes ahead of a first load is checked against what a load writes in tests/models/test_loading.py
(`test_gguf_dequantised_tensors_are_cached`)."""

from __future__ import annotations

NAME = "smollm2-135m-instruct-q4_1.gguf"  # the smallest GGUF asset


def test_assets_not_fetched_are_skipped_and_unknown_names_refused(tmp_path, monkeypatch, capsys):
    from jaxchat.models import prepare_assets

    monkeypatch.setenv("JAXCHAT_CACHE", str(tmp_path))  # nothing fetched here
    assert prepare_assets.main([NAME]) == 0
    assert f"{NAME}: not fetched, skipped" in capsys.readouterr().out
    assert prepare_assets.main(["no-such.gguf"]) == 1
    assert "not a GGUF asset: no-such.gguf" in capsys.readouterr().err

