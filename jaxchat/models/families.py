"""From a family name to its implementation: the module, its HF tensor table, its abstract model.

Contract: the family "x" (one of `config.FAMILIES`) is implemented by the module `jaxchat.models.x`,
which defines `Model` (an nnx module built as `Model(cfg, dtype)`) and `hf_entries(cfg)` (its HF
tensor-name table, a list of `entries.Entry`). `family_module` imports it (an unsupported family
raises `ModelLoadError`); `table(cfg)` is the table keyed by HF name; `abstract_model(cfg, dtype)`
the (graphdef, abstract nnx state with `axes` metadata) without allocating parameters;
`abstract_params(cfg, dtype)` the same params as the loaders return them (a pure dict of
ShapeDtypeStructs; a listed family's `layers` a tuple of per-layer dicts, see `layers.CausalLM`).
`is_stacked(cfg)`: whether the family stacks its layers. The family modules never import this module.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from jaxchat.models.config import FAMILIES, ModelConfig, ModelLoadError
from jaxchat.models.entries import Entry


def family_module(family: str) -> ModuleType:
    if family not in FAMILIES:
        raise ModelLoadError(f"family: unsupported model family {family!r}")
    return importlib.import_module(f"jaxchat.models.{family}")


def table(cfg: ModelConfig) -> dict[str, Entry]:
    return {e.hf: e for e in family_module(cfg.family).hf_entries(cfg)}


def abstract_model(cfg: ModelConfig, dtype):
    """(graphdef, abstract nnx State with `axes` metadata) without allocating parameters."""
    from flax import nnx

    model_cls = family_module(cfg.family).Model
    module = nnx.eval_shape(lambda: model_cls(cfg, dtype))
    return nnx.split(module)


def is_stacked(cfg: ModelConfig) -> bool:
    """True when the family's layers are one stack (`layers.CausalLM.stacked`), False when listed."""
    return bool(family_module(cfg.family).Model.stacked)


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
