"""The registry of model families: from a family name (or an HF `model_type`, or a GGUF architecture) to
its implementation: the module, its config.json table, its HF tensor table, its abstract model.

Contract: `FAMILIES` is the one list of supported families (HF `model_type`s); the family "x" is
implemented by the module `jaxchat.models.x`, which defines `Model` (an nnx module built as
`Model(cfg, dtype)`), `hf_entries(cfg)` (its HF tensor-name table, a list of `entries.Entry`) and
`HF_CONFIG` (its config.json fields, a tuple of `config.HF` rows beside `config.SHARED`), and optionally
`hf_config_read(d, kw)` / `hf_config_write(cfg, d)` (what its table cannot say), `GGUF_ARCH` (the
llama.cpp `general.architecture` it loads from) and `hf_entries_for(cfg, names)` (the table
of the naming a checkpoint with those tensor names uses). `family_module` imports it (an unsupported family
raises `ModelLoadError`); `from_hf_config(d)` reads a config.json dict (`model_type` one of `FAMILIES`, a
wrapper of `WRAPPERS` with a `text_config`, or a text type of `TEXT_TYPES`) and `to_hf_config(cfg)` writes
one that reads back to an equal config; `gguf_families()` maps GGUF architectures to families;
`table(cfg)` is the tensor table keyed by HF name; `abstract_model(cfg, dtype)` the (graphdef, abstract nnx state with `axes` metadata) without allocating parameters;
`abstract_params(cfg, dtype)` the same params as the loaders return them (a pure dict of
ShapeDtypeStructs; a listed family's `layers` a tuple of per-layer dicts, see `layers.CausalLM`).
`is_stacked(cfg)`: whether the family stacks this config's layers. The family modules never import this module.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

from jaxchat.models.config import ModelConfig, ModelLoadError, config_from_hf, config_to_hf
from jaxchat.models.entries import Entry

FAMILIES = ("llama", "qwen2", "qwen3", "gemma3_text", "qwen3_moe", "gpt_oss", "gemma4_text", "lfm2", "lfm2_moe",
            "qwen3_next", "qwen3_5_text", "qwen3_5_moe")  # HF model_type; the family "x" lives in jaxchat.models.x
WRAPPERS = {"gemma3": "gemma3_text", "gemma4": "gemma4_text", "qwen3_5": "qwen3_5_text",
            "qwen3_5_moe": "qwen3_5_moe"}  # with a text_config
TEXT_TYPES = {"qwen3_5_moe_text": "qwen3_5_moe"}  # HF text-config model_type -> family


def family_module(family: str) -> ModuleType:
    if family not in FAMILIES:
        raise ModelLoadError(f"family: unsupported model family {family!r}")
    return importlib.import_module(f"jaxchat.models.{family}")


def from_hf_config(d: dict) -> ModelConfig:
    """The `ModelConfig` of a config.json dict, read through its family's `HF_CONFIG`."""
    mt = d.get("model_type")
    if mt in WRAPPERS and isinstance(d.get("text_config"), dict):
        mt = WRAPPERS[mt]
        d = {**d["text_config"], "model_type": mt}
    mt = TEXT_TYPES.get(mt, mt)
    if mt not in FAMILIES:
        raise ModelLoadError(f"config.json: model_type {mt!r} is not supported")
    mod = family_module(mt)
    return config_from_hf(d, mt, mod.HF_CONFIG, getattr(mod, "hf_config_read", None))


def to_hf_config(cfg: ModelConfig) -> dict:
    """A config.json dict (4.x style) that `from_hf_config` reads back to an equal config."""
    mod = family_module(cfg.family)
    d = config_to_hf(cfg, mod.HF_CONFIG, getattr(mod, "hf_config_write", None))
    d["model_type"] = next((t for t, f in TEXT_TYPES.items() if f == cfg.family), cfg.family)  # transformers' text config
    return d


@functools.cache
def gguf_families() -> dict[str, str]:
    """GGUF `general.architecture` -> family, from the family modules' `GGUF_ARCH`."""
    return {m.GGUF_ARCH: f for f in FAMILIES if hasattr(m := family_module(f), "GGUF_ARCH")}


def table(cfg: ModelConfig, names: frozenset[str] | None = None) -> dict[str, Entry]:
    """The family's table; a family whose checkpoints come in several namings (`hf_entries_for`) picks
    the one of the tensor `names` given (`hf_entries(cfg)`, its canonical naming, without them)."""
    mod = family_module(cfg.family)
    if names is not None and hasattr(mod, "hf_entries_for"):
        return {e.hf: e for e in mod.hf_entries_for(cfg, names)}
    return {e.hf: e for e in mod.hf_entries(cfg)}


def abstract_model(cfg: ModelConfig, dtype):
    """(graphdef, abstract nnx State with `axes` metadata) without allocating parameters."""
    from flax import nnx

    model_cls = family_module(cfg.family).Model
    module = nnx.eval_shape(lambda: model_cls(cfg, dtype))
    return nnx.split(module)


def is_stacked(cfg: ModelConfig) -> bool:
    """True when the config's layers are one stack (`layers.CausalLM.is_stacked`), False when listed."""
    return bool(family_module(cfg.family).Model.is_stacked(cfg))


def as_params(pure: dict, cfg: ModelConfig) -> dict:
    """An nnx pure dict in the params form: a listed family's `layers` ({0: ..., 1: ...}) as a tuple."""
    if is_stacked(cfg):
        return pure
    layers = pure["layers"]
    return {**pure, "layers": tuple(layers[k] for k in sorted(layers, key=int))}


def abstract_params(cfg: ModelConfig, dtype) -> dict:
    """The params' pure dict of ShapeDtypeStructs, in the form the loaders return."""
    from flax import nnx

    _, abstract = abstract_model(cfg, dtype)
    return as_params(nnx.to_pure_dict(abstract), cfg)
