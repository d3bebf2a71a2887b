"""Model families (flax nnx) and weight loading: HF safetensors, GGUF (dequantised), orbax checkpoints.

Contract: see `jaxchat.models.base` for the forward/cache/layout interface the engine relies on
(`LoadedModel`, `StepModel`), `jaxchat.models.config` for `ModelConfig`, `jaxchat.models.families` for the supported `FAMILIES`
(the registry: `from_hf_config`, `to_hf_config`),
`jaxchat.models.load` for `load_model` / `save_orbax`. Importing this package does not import jax.
"""

from jaxchat.models.base import LoadedModel, StepModel, new_pools, unstack_layers
from jaxchat.models.config import ModelConfig, ModelLoadError
from jaxchat.models.families import FAMILIES, from_hf_config, to_hf_config
from jaxchat.models.load import load_model, save_orbax

__all__ = ["FAMILIES", "LoadedModel", "ModelConfig", "ModelLoadError", "StepModel", "from_hf_config", "new_pools",
           "load_model", "save_orbax", "to_hf_config", "unstack_layers"]
