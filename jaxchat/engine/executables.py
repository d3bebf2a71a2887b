"""Serialized XLA executables of the step programs: a warm start loads them from disk instead of tracing,
lowering and compiling each one again.

Contract: `ExecutableStore(directory, identity)` keeps one file per program under `directory`.
`store.load_or_compile(name, program, args, on_lowered=None)` returns a `jax.stages.Compiled` for the jitted
`program` called with `args`: deserialized from its file when one exists for the same key, else lowered and
compiled for real (JAX's persistent compilation cache off for that compile: an executable it returns does not
serialize whole on XLA:CPU), then written for the next start. So the step programs of a `jaxchat serve` that keeps
executables are not in XLA's persistent cache. `on_lowered()`, when given, runs once the program is loaded or
lowered: what is left of it, XLA's compile, leaves the GIL free.
The key hashes everything a program's executable depends on: `identity` (what the caller's traced code
closes over: model config, dtype, constants), `name` (which program, with its static options), the abstract
signature of `args` (tree structure, shapes, dtypes, shardings and their devices), the jax, jaxlib and flax versions,
`XLA_FLAGS`, the backend and its devices, and a digest of jaxchat's own sources, so an edit to the code never
loads a stale program. (A wrapper installed on a model's forward is not in the key: an engine built with one
must not be given a store.)
A file that cannot be read or loaded is replaced by a fresh compile; a program that cannot be serialized is
simply compiled each start. Files are written atomically (a temporary file, then a rename).
`store.loaded` / `store.saved` count programs loaded from and written to disk; `store.used` names the file of each
program asked for. A file another thread deserialized ahead of time (`executable_preload`) is taken from there
(`store.ahead` counts them, within `loaded`).
Inside `with store.deferring():` the files of the programs compiled are not written yet but kept in memory
until `store.save_deferred()` (from any thread, once: an engine's first set is written by its background
compile thread once the engine is quiet, off the path to its first request); a store dropped before that only
costs the next start its compiles.

Loading executes what the file holds (pickle), so the directory must be as trusted as the code itself: it
lives under the user's own asset cache.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import pickle
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import flax
import jax
import jaxlib
import numpy as np
from jax.experimental import serialize_executable

from jaxchat.assets import atomic_write
from jaxchat.engine import executable_preload

log = logging.getLogger(__name__)
_FORMAT = 2  # 2: a file holds (blob, an example of the arguments, an example of the outputs)


@functools.cache
def source_digest() -> str:
    """sha256 over every Python source of the jaxchat package (paths and contents)."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _leaf_signature(x: Any) -> str:
    placed = isinstance(x, jax.Array) or (isinstance(x, jax.ShapeDtypeStruct) and x.sharding is not None)
    if placed:  # the devices too (replicas' programs differ only there); an array or its abstract twin alike
        mesh = getattr(x.sharding, "mesh", None)
        ids = (mesh.device_ids.flatten().tolist() if mesh is not None and hasattr(mesh, "device_ids")
               else sorted(d.id for d in x.sharding.device_set))
        return f"{x.shape}/{x.dtype}/{x.weak_type}/{x.sharding}/{ids}"
    if isinstance(x, (np.ndarray, np.generic)):
        return f"{x.shape}/{x.dtype}/np"
    return f"{type(x).__name__}:{x!r}"


def args_signature(args: tuple) -> str:
    leaves, tree = jax.tree.flatten(args)
    return f"{tree}|" + ";".join(map(_leaf_signature, leaves))


def _backend_signature() -> str:
    devices = jax.devices()
    return f"{jax.default_backend()}|{devices[0].client.platform_version}|" + ",".join(
        f"{d.id}:{d.device_kind}:{d.process_index}" for d in devices)


class ExecutableStore:
    def __init__(self, directory: str | os.PathLike, identity: str) -> None:
        self.directory = Path(directory)
        self.identity = identity
        self.loaded = 0
        self.saved = 0
        self.used: list[str] = []  # the file of each program asked for, in order
        self.ahead = 0  # programs loaded from their files ahead of time (`executable_preload`)
        self._deferring = False
        self._deferred: list[tuple[Path, jax.stages.Compiled]] = []
        self._deferred_lock = threading.Lock()

    def key(self, name: str, args: tuple) -> str:
        h = hashlib.sha256()
        for part in (str(_FORMAT), jax.__version__, jaxlib.__version__, flax.__version__,
                     os.environ.get("XLA_FLAGS", ""), _backend_signature(), source_digest(), self.identity, name,
                     args_signature(args)):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()

    def load_or_compile(self, name: str, program: Any, args: tuple,
                        on_lowered: Callable[[], None] | None = None) -> jax.stages.Compiled:
        path = self.directory / f"{self.key(name, args)}.xla"
        self.used.append(path.name)
        compiled = self._load(path, args)
        if compiled is not None:
            self.loaded += 1
            if on_lowered is not None:
                on_lowered()
            return compiled
        compiled = _compile_afresh(program, args, on_lowered)
        if self._deferring:
            with self._deferred_lock:
                self._deferred.append((path, compiled))
        else:
            self._save(path, compiled)
        return compiled

    @contextlib.contextmanager
    def deferring(self) -> Iterator[None]:
        """Keep the files of the programs compiled inside in memory until `save_deferred`."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False

    def save_deferred(self) -> None:
        """Write the files `deferring` kept back (none: nothing to do)."""
        with self._deferred_lock:
            deferred, self._deferred = self._deferred, []
        for path, compiled in deferred:
            self._save(path, compiled)

    def _load(self, path: Path, args: tuple) -> jax.stages.Compiled | None:
        in_tree = jax.tree.structure((args, {}))
        preloaded = executable_preload.take(path)
        if preloaded is not None and preloaded[0] == in_tree:
            self.ahead += 1
            return preloaded[1]
        if not path.exists():
            return None
        try:
            tree, compiled = read_program(path)
            if tree != in_tree:
                raise ValueError("its arguments are not the program's")
            return compiled
        except Exception as exc:  # noqa: BLE001  (a damaged or foreign file: compile again and overwrite it)
            log.warning("could not load the compiled program %s (%s: %s); compiling it", path.name,
                        type(exc).__name__, exc)
            return None

    def _save(self, path: Path, compiled: jax.stages.Compiled) -> None:
        try:
            blob, in_tree, out_tree = serialize_executable.serialize(compiled)
            examples = [jax.tree.unflatten(tree, [0] * tree.num_leaves) for tree in (in_tree, out_tree)]
            payload = pickle.dumps((blob, *examples))
            with atomic_write(path) as f:
                f.write(payload)
            self.saved += 1
        except Exception as exc:  # noqa: BLE001  (not serializable, or the disk said no: only the next start pays)
            log.warning("could not save the compiled program %s (%s: %s)", path.name, type(exc).__name__, exc)


def read_program(path: Path) -> tuple[Any, jax.stages.Compiled]:
    """(the tree of its arguments, the program) of a store file; raises on a damaged or foreign one."""
    with path.open("rb") as f:
        blob, in_example, out_example = pickle.load(f)
    in_tree = jax.tree.structure(in_example)
    return in_tree, serialize_executable.deserialize_and_load(blob, in_tree, jax.tree.structure(out_example))


def _compile_afresh(program: Any, args: tuple, on_lowered: Callable[[], None] | None = None) -> jax.stages.Compiled:
    """Lower and compile with JAX's persistent compilation cache off: on XLA:CPU an executable loaded from that
    cache serializes without some of its kernels ("Function ... not found" when the copy runs), so a program
    that is to be written must be compiled for real. `on_lowered()` runs between the two."""
    with _CACHE_OFF:  # the setting is process-wide: off while any such compile runs (several may, in parallel)
        lowered = program.lower(*args)
        if on_lowered is not None:
            on_lowered()
        return lowered.compile()


class _CacheOffWhileCompiling:
    """JAX's persistent compilation cache turned off when the first of the compiles inside enters, and back to
    its setting when the last leaves, so compiles that must not touch it can run in parallel threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inside = 0
        self._enabled = False
        self._level = logging.NOTSET

    def __enter__(self) -> None:
        with self._lock:
            if self._inside == 0:
                self._enabled, self._level = jax.config.jax_enable_compilation_cache, _jax_cache_log().level
                _jax_cache_log().setLevel(max(self._level, logging.WARNING))  # "Resetting cache at ...", at INFO
                _use_compilation_cache(False)
            self._inside += 1

    def __exit__(self, *exc: Any) -> None:
        with self._lock:
            self._inside -= 1
            if self._inside == 0:
                _use_compilation_cache(self._enabled)
                _jax_cache_log().setLevel(self._level)


def _jax_cache_log() -> logging.Logger:
    from jax._src import compilation_cache

    return logging.getLogger(compilation_cache.__name__)


def _use_compilation_cache(enabled: bool) -> None:
    """Turn JAX's persistent cache on or off (JAX memoizes whether its cache is in use: reset it)."""
    from jax._src import compilation_cache

    jax.config.update("jax_enable_compilation_cache", enabled)
    compilation_cache.reset_cache()


_CACHE_OFF = _CacheOffWhileCompiling()


def program_identity(model: Any) -> str:
    """What a model's traced forward closes over, as text: its class, config, dtype, quantisation and layout
    flags (the params themselves are arguments, so their shapes are in each program's signature)."""
    parts = (type(model).__module__, type(model).__qualname__, repr(model.config), str(model.dtype),
             str(model.quantize), str(model.stacked))
    return "|".join(parts)
