"""Programs loaded ahead of their engine: a warm start deserializes the executable-store files its last start
loaded first, on a thread, while the weights load (XLA's deserialization leaves the GIL free; the weights' load,
imports and tokenizer hold it), so that the warm-up finds them loaded.

Contract:
- `start_key(source, config, devices)` names a start: the model's path (and its file's size and mtime), the
  engine config's fields and the devices (ids and platform).
- `record(directory, key, names)`: after a warm-up, the store files its first set used (their names), written to
  `<directory>/first-set-<key>.json` (atomically; an OSError only costs the next start's speed); it drops what
  no warm-up took (`forget`).
- `preload(directory, key, read)`: a daemon thread reading each recorded file still there with `read(path)`
  (`executables.read_program`: the tree of its arguments and the program), each into this module's registry;
  None when nothing is recorded.
- `take(path)`: the preloaded `jax.stages.Compiled` of the store file `path` (waiting for it if its load is under
  way), once; None when it was not preloaded or could not be. The store calls it before reading a file itself, and
  uses what it gets only for the very file it would read (the file's name is the program's key), so a stale
  record costs the thread's time, never a wrong program.
- `forget()`: drops what no engine took (a record of another process's programs, say).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from jaxchat.assets import atomic_write

log = logging.getLogger(__name__)
_lock = threading.Lock()
_preloaded: dict[str, Future] = {}


def start_key(source: str, config: Any, devices: Iterable[Any]) -> str:
    h = hashlib.sha256()
    path = Path(source)
    stat = path.stat() if path.is_file() else None
    parts = (str(path.resolve()), f"{stat.st_size}-{stat.st_mtime_ns}" if stat else "", repr(config),
             ",".join(f"{d.platform}:{d.id}" for d in devices))
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _record_file(directory: str | os.PathLike, key: str) -> Path:
    return Path(directory) / f"first-set-{key}.json"


def record(directory: str | os.PathLike, key: str, names: list[str]) -> None:
    forget()  # a warm-up is done: what it did not take, nothing will
    target = _record_file(directory, key)
    try:
        with atomic_write(target, "w") as f:
            json.dump(names, f)
    except OSError as exc:
        log.warning("could not record the first programs in %s (%s)", target, exc)


def preload(directory: str | os.PathLike, key: str, read: Callable[[Path], Any]) -> threading.Thread | None:
    try:
        names = json.loads(_record_file(directory, key).read_text())
    except (OSError, ValueError):
        return None
    paths = [str(Path(directory) / name) for name in names if isinstance(name, str) and Path(name).name == name]
    paths = [p for p in paths if os.path.exists(p)]
    if not paths:
        return None
    futures = {p: Future() for p in paths}
    with _lock:
        _preloaded.update(futures)

    def load_all() -> None:
        for path, future in futures.items():
            try:
                future.set_result(read(Path(path)))
            except Exception as exc:  # noqa: BLE001 - the store reads (and reports) it again itself
                future.set_result(None)
                log.debug("could not preload %s (%s)", path, exc)

    thread = threading.Thread(target=load_all, name="jaxchat-preload", daemon=True)
    thread.start()
    return thread


def take(path: str | os.PathLike) -> Any:
    with _lock:
        future = _preloaded.pop(str(path), None)
    return future.result() if future is not None else None


def forget() -> None:
    with _lock:
        _preloaded.clear()
