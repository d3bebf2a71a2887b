"""The converted-weights cache of GGUF files: their dequantised float32 tensors in one safetensors file each,
checked by content before they are used.

Contract:
- `cache_file(path)`: where the GGUF file at `path` is cached:
  `$JAXCHAT_CACHE/dequantized/<stem>-<where>-<size>-<mtime_ns>-f32-v<VERSION>.safetensors` (`where`: a hash of
  the file's absolute path, so two `model.gguf` in two folders do not share one; size and mtime find it fast;
  the stored dtype and the format version are in the name); None when JAXCHAT_DEQUANT_CACHE=0.
- `CacheWriter(file, shapes, metadata, source)` writes float32 tensors of known shapes into the file as they
  are loaded (`wrap(name, tensor)`), one at a time (the layout is fixed up front, nothing is held in memory),
  and publishes it (`finish`) only when every tensor was written, with checksums in its metadata: the CRC-32
  of the source GGUF file's content (`source_crc32`), of the other metadata (`metadata_crc32`) and of each
  tensor's bytes (`tensor_crc32`, a JSON object). Publishing removes the caches of the same path under other
  sizes, mtimes or versions (stale files of gigabytes), and version 2's files of the same stem.
  Any OSError turns the writer off: a read-only or full cache only costs speed.
- `open_cache(file)` -> (safetensors handle, metadata), or (None, None) when absent, unreadable or without
  checksums.
- `mapped_tensors(file)` -> each tensor of the file as a read-only numpy view of one memory map of it (no copy
  until the caller copies: the loader copies each once, into the param it fills), with its shape and its slices
  (a multi-host process's blocks) as views too.
- `damage(file, metadata, source)` -> None when the cache holds what it says, else why not: the source GGUF's
  content is not the one it was made from (a file replaced with the same size and mtime), its metadata (config,
  chat template) or a tensor's bytes do not match their checksums (a damaged file), or the check itself could
  not run (an unreadable file, a malformed header); it never raises. It reads both files whole (zlib's CRC-32, ~2 GB/s here: the
  loader runs it on a thread beside the copy into device arrays, and drops what it copied when this fails).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import zlib
from pathlib import Path

import numpy as np

VERSION = 3  # bump when the fix-ups, names or checksums written to the cache change
_BLOCK = 1 << 24
_PLACEHOLDER = "00000000"
_CHECKSUMS = ("metadata_crc32", "source_crc32", "tensor_crc32")  # metadata keys the writer adds


def cache_file(path: Path) -> Path | None:
    if os.environ.get("JAXCHAT_DEQUANT_CACHE", "1") == "0":
        return None
    from jaxchat.assets import cache_dir

    st = path.stat()
    where = f"{zlib.crc32(str(path.resolve()).encode()):08x}"
    return (cache_dir() / "dequantized"
            / f"{path.stem}-{where}-{st.st_size}-{st.st_mtime_ns}-f32-v{VERSION}.safetensors")


def file_crc32(path: Path, start: int = 0, length: int | None = None) -> str:
    """The CRC-32 of `length` bytes of the file at `path` from `start` (all of the rest: None), 8 hex digits."""
    crc = 0
    with open(path, "rb") as f:
        f.seek(start)
        left = length if length is not None else os.fstat(f.fileno()).st_size - start
        while left > 0:
            block = f.read(min(_BLOCK, left))
            if not block:
                break
            crc = zlib.crc32(block, crc)
            left -= len(block)
    return f"{crc:08x}"


class CacheWriter:
    def __init__(self, file: Path, shapes: dict[str, tuple[int, ...]], metadata: dict[str, str], source: Path) -> None:
        self.file, self.source, self.pending, self.offsets, self.crcs = file, source, set(shapes), {}, {}
        self.metadata = dict(metadata)
        self.layout, at = {}, 0
        for name, shape in shapes.items():
            size = 4 * int(np.prod(shape, dtype=np.int64))
            self.layout[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + size]}
            self.offsets[name], at = at, at + size
        raw = self._header({name: _PLACEHOLDER for name in shapes}, _PLACEHOLDER)
        self.data_start = 8 + len(raw)
        self.out = None
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            fd, self.tmp = tempfile.mkstemp(dir=file.parent, prefix=".tmp-", suffix=".safetensors")
            self.out = os.fdopen(fd, "wb")
            self.out.write(len(raw).to_bytes(8, "little") + raw)
            self.out.truncate(self.data_start + at)
        except OSError:
            self.close()

    def _header(self, crcs: dict[str, str], source_crc: str) -> bytes:
        """The safetensors header (padded to 8 bytes); the checksums are fixed-width, so placeholders first and
        the real values at `finish` take the same bytes."""
        ordered = {name: crcs[name] for name in self.layout}  # the file's order, whatever order they were loaded in
        metadata = {**self.metadata, "metadata_crc32": metadata_crc32(self.metadata), "source_crc32": source_crc,
                    "tensor_crc32": json.dumps(ordered, separators=(",", ":"))}
        raw = json.dumps({"__metadata__": metadata, **self.layout}, separators=(",", ":")).encode()
        return raw + b" " * (-len(raw) % 8)

    def wrap(self, name: str, tensor):
        from jaxchat.models.weights import Tensor

        def load():
            x = tensor.load()
            if self.out is not None:
                try:
                    data = np.ascontiguousarray(x, "<f4").tobytes()
                    self.out.seek(self.data_start + self.offsets[name])
                    self.out.write(data)
                    self.crcs[name] = f"{zlib.crc32(data):08x}"
                    self.pending.discard(name)
                except OSError:
                    self.close()
            return x

        return Tensor(tensor.shape, load)

    def finish(self) -> None:
        if self.out is None:
            return
        try:
            if not self.pending:
                raw = self._header(self.crcs, file_crc32(self.source))
                assert 8 + len(raw) == self.data_start, "the checksums changed the header's length"
                self.out.seek(8)
                self.out.write(raw)
            self.out.close()
            if not self.pending:
                umask = os.umask(0)
                os.umask(umask)
                os.chmod(self.tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide it from other users
                os.replace(self.tmp, self.file)
                _remove_stale_siblings(self.file)
        except OSError:
            pass
        self.close()

    def close(self) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None
        if getattr(self, "tmp", None) and os.path.exists(self.tmp):
            os.unlink(self.tmp)


def metadata_crc32(metadata: dict[str, str]) -> str:
    """The CRC-32 of the metadata a writer was given (config, chat template), whatever its order."""
    return f"{zlib.crc32(json.dumps(metadata, sort_keys=True).encode()):08x}"


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
        if not {"config", *_CHECKSUMS} <= meta.keys():
            raise ValueError("no config or checksums")
        return handle, meta
    except Exception:  # noqa: BLE001 - unreadable or damaged: dequantise again (and rewrite it)
        return None, None


def _read_layout(f) -> tuple[int, dict]:
    """(the header's length, the header: each tensor's dtype, shape and data offsets) of an open safetensors file;
    the data starts at 8 + that length."""
    length = int.from_bytes(f.read(8), "little")
    return length, json.loads(f.read(length))


def mapped_tensors(file: Path) -> dict[str, tuple[tuple[int, ...], np.ndarray]]:
    """name -> (shape, a read-only float32 view of the file's memory map); the map lives as long as a view."""
    import mmap

    with open(file, "rb") as f:
        length, layout = _read_layout(f)
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    mapped.madvise(mmap.MADV_WILLNEED)  # the kernel reads ahead while the first tensors are copied
    out = {}
    for name, entry in layout.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] != "F32":
            raise ValueError(f"tensor {name} is {entry['dtype']}, not F32")
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        view = np.frombuffer(mapped, "<f4", (end - begin) // 4, 8 + length + begin).reshape(shape)
        out[name] = (shape, view)
    return out


def damage(file: Path, metadata: dict[str, str], source: Path) -> str | None:
    try:
        return _damage(file, metadata, source)
    except Exception as exc:  # noqa: BLE001 - a check that cannot run is a cache that cannot be trusted
        return f"its checksums could not be verified ({type(exc).__name__}: {exc})"


def _damage(file: Path, metadata: dict[str, str], source: Path) -> str | None:
    given = {k: v for k, v in metadata.items() if k not in _CHECKSUMS}
    if metadata_crc32(given) != metadata["metadata_crc32"]:
        return "its metadata (config, chat template) does not match its checksum (a damaged file)"
    if file_crc32(source) != metadata["source_crc32"]:
        return f"{source.name} is not the file it was made from (its content changed)"
    with open(file, "rb") as f:
        length, layout = _read_layout(f)
    crcs = json.loads(metadata["tensor_crc32"])
    for name, entry in layout.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        if file_crc32(file, 8 + length + begin, end - begin) != crcs.get(name):
            return f"tensor {name} does not match its checksum (a damaged file)"
    return None
