"""JAX's persistent compilation cache for jaxchat's programs: a second start of the same model and shapes
loads every program from disk instead of compiling it.

Contract: `enable_compile_cache(path=None)` points JAX at `path` (default `default_compile_cache_dir()`:
`jax-compilation-cache` under the asset cache, `$JAXCHAT_CACHE` or `~/.cache/jaxchat`), creating it, with
every program cached whatever its compile time or size; it returns the directory. An environment that already
sets `JAX_COMPILATION_CACHE_DIR` keeps its directory when `path` is None. `disable_compile_cache()` turns
the persistent cache off (even where the environment enables it). Call either before the first compile.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

from jaxchat.assets import cache_dir


def default_compile_cache_dir() -> Path:
    return Path(os.environ.get("JAX_COMPILATION_CACHE_DIR") or cache_dir() / "jax-compilation-cache")


def enable_compile_cache(path: str | os.PathLike | None = None) -> Path:
    directory = Path(path) if path is not None else default_compile_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory


def disable_compile_cache() -> None:
    jax.config.update("jax_enable_compilation_cache", False)
