"""HF safetensors directories (single file or sharded index; bf16/fp16/fp32), read without torch.

Contract: `load_hf(dir, dtype, mesh)` reads `config.json`, every tensor listed by
`model.safetensors.index.json` (or all `*.safetensors` files), checks them strictly against the
family table (see `weights.assemble`; MXFP4 `_blocks` / `_scales` pairs are first folded into their
dequantised tensors, `mxfp4.fold_mxfp4`; a multimodal Gemma 3/4 checkpoint's text decoder is read under
its text-model names, `gemma_text_tensors`; a family module's `hf_tensors`, see `text_decoder_tensors`,
applies first), and loads the tokenizer and chat template from the same
directory when it has tokenizer files. eos ids come from `generation_config.json` when present.
"""

from __future__ import annotations

import json
from pathlib import Path

from jaxchat.models.base import LoadedModel
from jaxchat.models.config import ModelConfig, ModelLoadError
from jaxchat.models.families import from_hf_config
from jaxchat.models.weights import Tensor, assemble

IGNORED = ("rotary_emb.inv_freq",)  # buffers some old checkpoints carry
# multimodal Gemma checkpoints (model_type "gemma3"/"gemma4" with a text_config): the text decoder's tensors
# live under model.language_model.; the towers and projectors of other modalities are not loaded
MULTIMODAL_TEXT = "model.language_model."
MULTIMODAL_OTHER = ("model.vision_tower.", "model.audio_tower.", "model.embed_vision.", "model.embed_audio.",
                    "model.multi_modal_projector.")


def safetensors_files(d: Path) -> list[Path]:
    index = d / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelLoadError(f"{index}: no 'weight_map'")
        files = sorted(set(weight_map.values()))
        for f in files:
            if not (d / f).exists():
                raise ModelLoadError(f"{index}: shard {f!r} does not exist")
        return [d / f for f in files]
    files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{d}: no *.safetensors files")
    return files


def read_safetensors(files: list[Path]) -> dict[str, Tensor]:
    from safetensors import safe_open

    tensors: dict[str, Tensor] = {}
    for f in files:
        with safe_open(str(f), framework="np") as h:
            for name in h.keys():  # noqa: SIM118 (safe_open is not iterable)
                if name in tensors:
                    raise ModelLoadError(f"tensor {name!r} appears in more than one shard ({f.name})")
                shape = tuple(h.get_slice(name).get_shape())
                tensors[name] = Tensor(shape, _loader(f, name), _slice_loader(f, name))
    return tensors


def _loader(f: Path, name: str):
    def load():
        from safetensors import safe_open

        with safe_open(str(f), framework="np") as h:
            return h.get_tensor(name)

    return load


def _slice_loader(f: Path, name: str):
    def load_slice(index: tuple[slice, ...]):
        from safetensors import safe_open

        with safe_open(str(f), framework="np") as h:
            return h.get_slice(name)[index]

    return load_slice


def gemma_text_tensors(hf_config: dict, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """The text decoder's tensors under their text-model names (a multimodal Gemma checkpoint's
    model.language_model.* as model.*, its other towers left out); other checkpoints as they are."""
    if hf_config.get("model_type") not in ("gemma3", "gemma4") or "text_config" not in hf_config:
        return tensors
    out = {}
    for name, t in tensors.items():
        if name.startswith(MULTIMODAL_TEXT):
            out["model." + name[len(MULTIMODAL_TEXT):]] = t
        elif not name.startswith(MULTIMODAL_OTHER):
            out[name] = t
    return out


def text_decoder_tensors(cfg: ModelConfig, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """The checkpoint's tensors under the names of the family table: the family module's `hf_tensors(cfg,
    tensors)` when it has one (renamed prefixes, skipped towers, fused expert stacks), else as read."""
    from jaxchat.models.families import family_module

    prepare = getattr(family_module(cfg.family), "hf_tensors", None)
    return tensors if prepare is None else prepare(cfg, tensors)


def tied_ignores(cfg: ModelConfig, tensors: dict) -> tuple[str, ...]:
    ign = tuple(n for n in tensors if any(n.endswith(s) for s in IGNORED))
    if cfg.tie_word_embeddings and "lm_head.weight" in tensors:
        ign += ("lm_head.weight",)  # a tied checkpoint may still store the (identical) head
    return ign


def read_eos(d: Path, cfg: ModelConfig) -> tuple[int, ...]:
    gen = d / "generation_config.json"
    if gen.exists():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        if eos is not None:
            return tuple(eos) if isinstance(eos, list) else (int(eos),)
    return cfg.eos_token_ids


def load_tokenizer(d: Path):
    if not any((d / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(d))


def load_hf(path: str | Path, dtype="float32", mesh=None) -> LoadedModel:
    d = Path(path)
    cfg_file = d / "config.json"
    if not cfg_file.exists():
        raise ModelLoadError(f"{d}: no config.json")
    hf_config = json.loads(cfg_file.read_text())
    cfg = from_hf_config(hf_config)
    tensors = text_decoder_tensors(cfg, gemma_text_tensors(hf_config, read_safetensors(safetensors_files(d))))
    if any(n.endswith(("_blocks", "_scales")) for n in tensors):
        import jax.numpy as jnp
        import numpy as np

        from jaxchat.models.mxfp4 import fold_mxfp4

        tensors = fold_mxfp4(tensors, np.dtype(jnp.dtype(dtype)))
    graphdef, params = assemble(cfg, tensors, dtype, mesh, ignore=tied_ignores(cfg, tensors), where=str(d),
                                desc=f"loading {d.name}")
    tok = load_tokenizer(d)
    template = getattr(tok, "chat_template", None) if tok is not None else None
    eos = read_eos(d, cfg)
    if not eos and tok is not None and tok.eos_token_id is not None:
        eos = (tok.eos_token_id,)
    cfg = cfg.replace(eos_token_ids=tuple(eos))
    return LoadedModel(cfg, graphdef, params, dtype, tokenizer=tok, chat_template=template,
                       eos_token_ids=eos, bos_token_id=cfg.bos_token_id, mesh=mesh, source=str(d))
