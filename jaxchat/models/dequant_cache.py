"""The converted-weights cache of GGUF files: the model's params as the loader assembles them (dequantised,
fixed up, transposed and stacked, float32) in one safetensors file each, checked by content before they are used.

Contract:
- `cache_file(path)`: where the GGUF file at `path` is cached:
  `$JAXCHAT_CACHE/dequantized/<stem>-<where>-<size>-<mtime_ns>-f32-v<VERSION>.safetensors` (`where`: a hash of
  the file's absolute path, so two `model.gguf` in two folders do not share one; size and mtime find it fast;
  the stored dtype and the format version are in the name); None when JAXCHAT_DEQUANT_CACHE=0.
- `write_cache(file, params, metadata, source)` writes float32 `params` (name -> array; a param's name is its
  path in the param tree joined by "/") with `metadata` (config, chat template) and content hashes (xxh3-64):
  of the source GGUF file (`source_xxh3`), of the other metadata (`metadata_xxh3`) and of each param's bytes
  (`param_xxh3`, a JSON object). Each param starts on a 64-byte boundary of the file (so a memory map of it is
  aligned as XLA:CPU needs to take it as a device array's memory): the header is padded to it, and the params
  whose sizes keep it come first. The file is written under a temporary name and published by a rename (a map
  of the old file stays valid), which also removes the caches of the same path under other sizes, mtimes or
  versions (stale files of gigabytes). Returns whether it was published: any OSError only costs speed.
- `open_cache(file)` -> (safetensors handle, metadata), or (None, None) when absent, unreadable or without
  hashes (an older version's file).
- `mapped_params(file)` -> each param as a read-only float32 view of one memory map of the file, 64-byte aligned:
  placed on CPU without a copy (`weights.place`), read in blocks by a multi-host process.
- `damage(file, metadata, source, params=None)` -> None when the cache holds what it says, else why not: the
  source GGUF's content is not the one it was made from (a file replaced with the same size and mtime), its
  metadata (config, chat template) or a param's bytes do not match their hashes (a damaged file), or the check
  itself could not run (an unreadable file, a malformed header); it never raises. It reads both files whole
  (xxh3: 0.1 s for the default model's 2.5 GB here; through `params`, the views being placed, when given).
"""

from __future__ import annotations

import json
import mmap
import os
import re
import zlib
from pathlib import Path

import numpy as np
import xxhash

from jaxchat.assets import atomic_write

VERSION = 4  # bump when the fix-ups, names, layout or hashes written to the cache change
ALIGN = 64  # XLA:CPU takes a host array aligned to this as a device array's memory, without copying it
_BLOCK = 1 << 24
_HASHES = ("metadata_xxh3", "source_xxh3", "param_xxh3")  # metadata keys the writer adds


def cache_file(path: Path) -> Path | None:
    if os.environ.get("JAXCHAT_DEQUANT_CACHE", "1") == "0":
        return None
    from jaxchat.assets import cache_dir

    st = path.stat()
    where = f"{zlib.crc32(str(path.resolve()).encode()):08x}"
    return (cache_dir() / "dequantized"
            / f"{path.stem}-{where}-{st.st_size}-{st.st_mtime_ns}-f32-v{VERSION}.safetensors")


def content_hash(data) -> str:
    """xxh3-64 of a bytes-like object (a C-contiguous array too), 16 hex digits."""
    return xxhash.xxh3_64_hexdigest(data)


def file_hash(path: Path) -> str:
    """xxh3-64 of the whole file at `path`, 16 hex digits."""
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def metadata_hash(metadata: dict[str, str]) -> str:
    """The hash of the metadata a writer was given (config, chat template), whatever its order."""
    return content_hash(json.dumps(metadata, sort_keys=True).encode())


def _layout(params: dict[str, np.ndarray]) -> dict[str, dict]:
    """name -> its safetensors entry; the params whose byte sizes are multiples of `ALIGN` first, so that every
    one of them starts aligned (the rest, if any, follow: they are copied when placed)."""
    order = sorted(params, key=lambda name: params[name].nbytes % ALIGN != 0)
    layout, at = {}, 0
    for name in order:
        size = params[name].nbytes
        layout[name] = {"dtype": "F32", "shape": list(params[name].shape), "data_offsets": [at, at + size]}
        at += size
    return layout


def write_cache(file: Path, params: dict[str, np.ndarray], metadata: dict[str, str], source: Path) -> bool:
    params = {name: np.ascontiguousarray(a, "<f4") for name, a in params.items()}
    layout = _layout(params)
    hashes = {name: content_hash(params[name]) for name in layout}
    meta = {**metadata, "metadata_xxh3": metadata_hash(metadata), "source_xxh3": file_hash(source),
            "param_xxh3": json.dumps(hashes, separators=(",", ":"))}
    raw = json.dumps({"__metadata__": meta, **layout}, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % ALIGN)  # the data starts aligned
    try:
        with atomic_write(file, shared=True) as out:
            out.write(len(raw).to_bytes(8, "little") + raw)
            for name in layout:
                out.write(memoryview(params[name]).cast("B"))
    except OSError:
        return False
    _remove_stale_siblings(file)
    return True


def _remove_stale_siblings(file: Path) -> None:
    """Delete the caches of the same GGUF path under other sizes, mtimes or versions, and version 2's files of the
    same stem (`<stem>-<size>-<mtime>-v2`: no reader of them is left)."""
    key = re.match(r"(?P<stem>.+)-(?P<where>[0-9a-f]{8})-\d+-\d+-f32-v\d+\.safetensors$", file.name)
    if key is None:
        return
    stem = re.escape(key["stem"])
    pattern = re.compile(rf"{stem}-{key['where']}-\d+-\d+-f32-v\d+\.safetensors|{stem}-\d+-\d+-v2\.safetensors")
    for other in file.parent.iterdir():
        if other != file and pattern.fullmatch(other.name):
            try:
                other.unlink()
            except OSError:
                pass


def open_cache(file: Path | None):
    from safetensors import safe_open

    if file is None or not file.exists():
        return None, None
    try:
        handle = safe_open(str(file), framework="numpy")
        meta = handle.metadata() or {}
        if not {"config", *_HASHES} <= meta.keys():
            raise ValueError("no config or hashes")
        return handle, meta
    except Exception:  # noqa: BLE001 - unreadable, damaged or an older version's: convert again (and rewrite it)
        return None, None


def _read_layout(f) -> tuple[int, dict]:
    """(the header's length, the header: each param's dtype, shape and data offsets) of an open safetensors file;
    the data starts at 8 + that length."""
    length = int.from_bytes(f.read(8), "little")
    return length, json.loads(f.read(length))


def mapped_params(file: Path) -> dict[str, np.ndarray]:
    """name -> a read-only float32 view of the file's memory map; the map lives as long as a view. The kernel
    reads the file ahead (MADV_WILLNEED) while the loader goes on."""
    with open(file, "rb") as f:
        length, layout = _read_layout(f)
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    mapped.madvise(mmap.MADV_WILLNEED)
    out = {}
    for name, entry in layout.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] != "F32":
            raise ValueError(f"param {name} is {entry['dtype']}, not F32")
        begin, end = entry["data_offsets"]
        out[name] = np.frombuffer(mapped, "<f4", (end - begin) // 4, 8 + length + begin).reshape(entry["shape"])
    return out


def damage(file: Path, metadata: dict[str, str], source: Path, params: dict[str, np.ndarray] | None = None
           ) -> str | None:
    try:
        return _damage(file, metadata, source, params)
    except Exception as exc:  # noqa: BLE001 - a check that cannot run is a cache that cannot be trusted
        return f"its hashes could not be verified ({type(exc).__name__}: {exc})"


def _damage(file: Path, metadata: dict[str, str], source: Path, params: dict[str, np.ndarray] | None) -> str | None:
    given = {k: v for k, v in metadata.items() if k not in _HASHES}
    if metadata_hash(given) != metadata["metadata_xxh3"]:
        return "its metadata (config, chat template) does not match its hash (a damaged file)"
    if file_hash(source) != metadata["source_xxh3"]:
        return f"{source.name} is not the file it was made from (its content changed)"
    hashes = json.loads(metadata["param_xxh3"])
    params = params if params is not None else mapped_params(file)
    if set(params) != set(hashes):
        return "its params are not the ones its hashes name (a damaged file)"
    for name, view in params.items():
        if content_hash(view) != hashes[name]:
            return f"param {name} does not match its hash (a damaged file)"
    return None
