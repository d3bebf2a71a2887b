"""Orbax checkpoints: a self-contained directory with params, config and tokenizer.

Contract: `save_orbax(model, dst)` writes `dst/params` (an orbax StandardCheckpointer tree of the
pure param dict), `dst/config.json` (HF-style, see `families.to_hf_config`), the tokenizer files
(`save_pretrained`, chat template included) and `dst/jaxchat_orbax.json` (the marker `load_model`
detects, with dtype, eos/bos ids and the chat template). `load_orbax(dst, dtype, mesh)` restores
straight into the target dtype and, given a mesh, into the target `NamedSharding`s (no host copy
of the full tree first). `dst` must not exist or be an empty directory. An int8 model (`model.quantize`)
is stored as its int8 values and scales (each `quant.Int8Weight` a dict {"int8_values", "int8_scale"}) with
"quantize" in the marker, and restores as int8 (`quantize.abstract_quantized`), never re-quantised.
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxchat.models.base import LoadedModel
from jaxchat.models.config import ModelLoadError
from jaxchat.models.families import from_hf_config, to_hf_config

MARKER = "jaxchat_orbax.json"


def save_orbax(model: LoadedModel, dst: str | Path) -> Path:
    import orbax.checkpoint as ocp

    dst = Path(dst).absolute()
    if dst.exists() and any(dst.iterdir()):
        raise ModelLoadError(f"orbax destination {str(dst)!r} exists and is not empty")
    dst.mkdir(parents=True, exist_ok=True)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(dst / "params", _plain(model.params))
        ckptr.wait_until_finished()
    (dst / "config.json").write_text(json.dumps(to_hf_config(model.config), indent=2))
    if model.tokenizer is not None:
        tok = model.tokenizer
        if model.chat_template and not getattr(tok, "chat_template", None):
            tok.chat_template = model.chat_template
        tok.save_pretrained(str(dst))
    meta = {
        "format": 1,
        "dtype": str(model.dtype),
        "eos_token_ids": list(model.eos_token_ids),
        "bos_token_id": model.bos_token_id,
        "chat_template": model.chat_template,
        "source": model.source,
        "quantize": getattr(model, "quantize", None),
    }
    (dst / MARKER).write_text(json.dumps(meta, indent=2))
    return dst


def load_orbax(path: str | Path, dtype="float32", mesh=None) -> LoadedModel:
    import jax
    import orbax.checkpoint as ocp

    from jaxchat.models.families import abstract_model, abstract_params
    from jaxchat.models.hf_loader import load_tokenizer

    path = Path(path).absolute()
    meta = json.loads((path / MARKER).read_text())
    cfg = from_hf_config(json.loads((path / "config.json").read_text()))
    graphdef, _ = abstract_model(cfg, dtype)
    quantize = meta.get("quantize")
    if quantize:
        from jaxchat.models.quantize import abstract_quantized

        shapes = abstract_quantized(cfg, dtype)
    else:
        shapes = abstract_params(cfg, dtype)
    if mesh is not None:
        from jaxchat.models.sharding import param_partition_specs

        specs = param_partition_specs(cfg, shapes, mesh)
        target = jax.tree.map(
            lambda s, p: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=jax.sharding.NamedSharding(mesh, p)),
            shapes, specs)
    else:
        dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=dev), shapes)
    with ocp.StandardCheckpointer() as ckptr:
        try:
            params = ckptr.restore(path / "params", _plain(target))
        except (ValueError, KeyError) as e:
            raise ModelLoadError(f"orbax checkpoint {str(path)!r} does not match its config.json: {e}") from e
    if quantize:
        params = _unplain(params, jax.numpy.dtype(dtype).name)
    tok = load_tokenizer(path)
    template = meta.get("chat_template") or (getattr(tok, "chat_template", None) if tok is not None else None)
    model = LoadedModel(cfg, graphdef, params, dtype, tokenizer=tok, chat_template=template,
                        eos_token_ids=tuple(meta.get("eos_token_ids") or cfg.eos_token_ids),
                        bos_token_id=meta.get("bos_token_id"), mesh=mesh, source=str(path))
    model.quantize = quantize
    return model


def _plain(tree):
    """The params with each `Int8Weight` as a dict {"int8_values", "int8_scale"} (what orbax stores)."""
    from jaxchat.models.quant import Int8Weight

    if isinstance(tree, Int8Weight):
        return {"int8_values": tree.values, "int8_scale": tree.scale}
    if isinstance(tree, dict):
        return {k: _plain(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_plain(v) for v in tree)
    return tree


def _unplain(tree, dtype):
    from jaxchat.models.quant import Int8Weight

    if isinstance(tree, dict) and set(tree) == {"int8_values", "int8_scale"}:
        return Int8Weight(tree["int8_values"], tree["int8_scale"], dtype)
    if isinstance(tree, dict):
        return {k: _unplain(v, dtype) for k, v in tree.items()}
    if isinstance(tree, (tuple, list)):
        return tuple(_unplain(v, dtype) for v in tree)
    return tree
