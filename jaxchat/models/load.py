"""The loading entry points: `load_model` picks the loader for a path; `save_orbax` writes a checkpoint.

Contract: `load_model(path, dtype, mesh)` auto-detects a `.gguf` file (`gguf_loader`), an orbax
checkpoint directory written by `save_orbax` (`orbax_io`, detected by its `jaxchat_orbax.json`
marker) or an HF safetensors directory with `config.json` (`hf_loader`), and returns a
`LoadedModel`; a path that is none of these raises `ModelLoadError` naming it. `model_config(path)` reads
the same path's `ModelConfig` alone (no weights; a config.json file itself too). `save_orbax` is
`orbax_io.save_orbax`. The GGUF and HF loaders are imported on first use (importing this module
stays cheap: no numpy, no jax); no loader imports this module.
`dtype` is "float32", "bfloat16" or "auto" (the default everywhere): `resolve_dtype("auto")` is
bfloat16 where `jax.default_backend()` is "tpu" or "gpu" and float32 on CPU; `load_model` logs the
dtype it chose. Any other name raises `ModelLoadError`.
`quantize` is None or "int8" (`quantize.QUANTIZE`): the loaded params' matmul weights become int8 with
per-output-channel scales (W8A8, `quant`), from any source; `model.quantize` says which. An orbax checkpoint
saved from an int8 model holds the int8 values and scales and loads as int8 without re-quantising.
"""

from __future__ import annotations

import logging
from pathlib import Path

from jaxchat.models.base import LoadedModel
from jaxchat.models.config import ModelConfig, ModelLoadError
from jaxchat.models.orbax_io import MARKER, load_orbax, save_orbax

__all__ = ["DTYPES", "QUANTIZE", "load_model", "model_config", "quantized", "resolve_dtype", "save_orbax"]

DTYPES = ("auto", "float32", "bfloat16")
QUANTIZE = ("int8",)
log = logging.getLogger("jaxchat.models")


def resolve_dtype(dtype: str = "auto") -> str:
    """The serving dtype: "auto" is bfloat16 on TPU and GPU, float32 on CPU; others are kept."""
    if dtype not in DTYPES:
        raise ModelLoadError(f"dtype {dtype!r} is not supported (choose one of {', '.join(DTYPES)})")
    if dtype != "auto":
        return dtype
    import jax

    return "bfloat16" if jax.default_backend() in ("tpu", "gpu") else "float32"


def load_model(path: str | Path, dtype: str = "auto", mesh=None, quantize: str | None = None) -> LoadedModel:
    """Load an HF safetensors directory, a `.gguf` file or an orbax checkpoint directory; with `quantize`
    ("int8") quantise its weights (an int8 orbax checkpoint loads as stored)."""
    path = Path(path)
    if quantize is not None and quantize not in QUANTIZE:
        raise ModelLoadError(f"quantize {quantize!r} is not supported (choose one of {', '.join(QUANTIZE)})")
    chosen = resolve_dtype(dtype)
    log.info("dtype %s%s%s", chosen, " (auto)" if dtype == "auto" else "", f", weights {quantize}" if quantize else "")
    dtype = chosen
    if path.is_file() and path.suffix == ".gguf":
        from jaxchat.models.gguf_loader import load_gguf

        return quantized(load_gguf(path, dtype=dtype, mesh=mesh), quantize)
    if path.is_dir() and (path / MARKER).exists():
        return quantized(load_orbax(path, dtype=dtype, mesh=mesh), quantize)
    if path.is_dir() and (path / "config.json").exists():
        from jaxchat.models.hf_loader import load_hf

        return quantized(load_hf(path, dtype=dtype, mesh=mesh), quantize)
    if not path.exists():
        raise ModelLoadError(f"model path {str(path)!r} does not exist")
    raise ModelLoadError(f"model path {str(path)!r} is not a .gguf file, an HF directory with config.json, "
                         "or a jaxchat orbax checkpoint")


def model_config(path: str | Path) -> ModelConfig:
    """The `ModelConfig` of what `load_model(path)` would load, read without its weights."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        from jaxchat.models.gguf_loader import gguf_config

        return gguf_config(path)
    config = path / "config.json" if path.is_dir() else path  # an HF directory, an orbax checkpoint, config.json
    if config.suffix == ".json" and config.is_file():
        import json

        from jaxchat.models.families import from_hf_config

        return from_hf_config(json.loads(config.read_text()))
    raise ModelLoadError(f"model path {str(path)!r} is not a .gguf file, a config.json or a directory with one")


def quantized(model: LoadedModel, quantize: str | None) -> LoadedModel:
    """`model` with its weights quantised (`quantize.quantize_params`; int8 weights are kept), in place."""
    if quantize is None:
        return model
    from jaxchat.models.quantize import quantize_params

    model.params = quantize_params(model.config, model.params, model.mesh)
    model.quantize = quantize
    return model
