"""Model families (flax nnx) and weight loading: HF safetensors, GGUF (dequantised), orbax checkpoints.

Contract: see `jaxchat.models.base` for the forward/cache/sharding interface the engine relies on.
"""

from jaxchat.models.base import (
    FAMILIES,
    LoadedModel,
    ModelConfig,
    ModelLoadError,
    empty_cache,
    layer_cache,
    load_model,
    save_orbax,
    unstack_layers,
)

__all__ = ["FAMILIES", "LoadedModel", "ModelConfig", "ModelLoadError", "empty_cache", "layer_cache", "load_model", "save_orbax", "unstack_layers"]
