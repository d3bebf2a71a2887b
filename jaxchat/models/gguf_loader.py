"""GGUF files (llama.cpp), dequantised with the `gguf` package into the target dtype.

Contract: `load_gguf(file, dtype, mesh)` maps the GGUF metadata of the architectures the family modules
name (`GGUF_ARCH`: "llama", "qwen2", "qwen3", "gemma3") to a `ModelConfig` through the family's config.json
table (its rows' `gguf` keys), renames every tensor to its HF name through a
strict table (an unknown GGUF tensor is an error naming it) and then goes through the same strict
check as HF checkpoints. Fix-ups of llama.cpp's converter are undone: llama Q/K rows are
un-permuted (rotary pairs interleaved back to halves), Gemma norm weights (stored as 1 + w) get 1
subtracted. A model without `output.weight` has tied embeddings. The tokenizer comes from the GGUF
through transformers, the chat template from the `tokenizer.chat_template` metadata. `gguf_config(file)` reads
the config alone.

Dequantising is slow (tens of seconds for a 0.5B model), so the first load of a GGUF file writes the model's
float32 params (dequantised, fixed up, assembled) to the converted-weights cache (`dequant_cache`: with the
config, chat template and content hashes as metadata), and later loads place them from a memory map of it,
without parsing the GGUF; a cache whose hashes fail is rebuilt, never used. JAXCHAT_DEQUANT_CACHE=0 turns the
cache off; an unwritable cache only costs speed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import re
from pathlib import Path

import numpy as np

from jaxchat.models import dequant_cache
from jaxchat.models.base import LoadedModel
from jaxchat.models.config import REQUIRED, ModelConfig, ModelLoadError, table
from jaxchat.models.families import family_module, from_hf_config, gguf_families
from jaxchat.models.weights import Tensor, assemble, host_params, place

log = logging.getLogger(__name__)

GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
BLOCK_NAMES = {  # GGUF suffix -> HF suffix, within blk.{i} / model.layers.{i}
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
GEMMA_BLOCK_NAMES = {
    **BLOCK_NAMES,
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
BLOCK_RE = re.compile(r"blk\.(\d+)\.(.+)")


def field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def hf_name(gguf_name: str, arch: str) -> str:
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    m = BLOCK_RE.fullmatch(gguf_name)
    table = GEMMA_BLOCK_NAMES if arch == "gemma3" else BLOCK_NAMES
    if m and m.group(2) in table:
        return f"model.layers.{m.group(1)}.{table[m.group(2)]}"
    raise ModelLoadError(f"unmapped GGUF tensor {gguf_name!r} for architecture {arch!r}")


def config_from_gguf(reader, names: set[str], embd_rows: int) -> ModelConfig:
    """The family's config.json table read from GGUF metadata: each row with a `gguf` key takes
    "<arch>.<key>", the rest of the family's fields their config.json defaults (`families.from_hf_config`);
    tied embeddings and q/k/v biases are told by the tensors present."""
    arch = field(reader, "general.architecture")
    archs = gguf_families()
    if arch not in archs:
        raise ModelLoadError(f"general.architecture {arch!r} is not supported (supported: {sorted(archs)})")
    family = archs[arch]
    d: dict = {"model_type": family, "vocab_size": embd_rows}
    for row in table(family_module(family).HF_CONFIG):
        v = field(reader, f"{arch}.{row.gguf}") if row.gguf else None
        if v is not None:
            d[row.keys[0]] = v
        elif row.gguf and row.default is REQUIRED and row.derive is None and row.keys[0] not in d:
            raise ModelLoadError(f"GGUF metadata {arch}.{row.gguf} is missing")
    if field(reader, f"{arch}.rope.scaling.type") == "linear":
        factor = field(reader, f"{arch}.rope.scaling.factor")
        if factor is None:
            raise ModelLoadError(f"GGUF metadata {arch}.rope.scaling.factor is missing")
        d["rope_scaling"] = {"rope_type": "linear", "factor": float(factor)}
    eos = [field(reader, k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")]
    d.update(tie_word_embeddings="output.weight" not in names, attention_bias="blk.0.attn_q.bias" in names,
             bos_token_id=field(reader, "tokenizer.ggml.bos_token_id"),
             eos_token_id=list(dict.fromkeys(int(e) for e in eos if e is not None)))
    return from_hf_config(d)


def unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: per head, rows (pair j, half h) -> (half h, pair j)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tensor(t, name: str, arch: str, cfg_heads: tuple[int, int]) -> Tensor:
    shape = tuple(int(s) for s in reversed(t.shape.tolist()))

    def load():
        from gguf.quants import dequantize

        x = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        if arch == "llama" and name.endswith("attn_q.weight"):
            x = unpermute(x, cfg_heads[0])
        elif arch == "llama" and name.endswith("attn_k.weight"):
            x = unpermute(x, cfg_heads[1])
        elif arch == "gemma3" and name.endswith("norm.weight"):
            x = x - 1.0
        return x

    return Tensor(shape, load)


def gguf_tokenizer(path: Path, template: str | None):
    """The GGUF's tokenizer through transformers; the (slow) conversion is cached on disk.

    The cache lives in `$JAXCHAT_CACHE/tokenizers/<stem>-<size>-<mtime_ns>` (save_pretrained output, which
    `saved_tokenizer.load_saved_tokenizer` reads, pickled after its first load); set JAXCHAT_TOKENIZER_CACHE=0 to
    always convert.
    """
    import os
    import shutil
    import tempfile

    from jaxchat.models.saved_tokenizer import load_saved_tokenizer

    cached = converted_tokenizer_dir(path)
    use_cache = os.environ.get("JAXCHAT_TOKENIZER_CACHE", "1") != "0"
    if use_cache and (cached / "tokenizer_config.json").exists():
        return load_saved_tokenizer(cached)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    if template and not getattr(tok, "chat_template", None):
        tok.chat_template = template
    if use_cache:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=cached.parent, prefix=".tmp-"))
            tok.save_pretrained(str(tmp))
            try:
                tmp.rename(cached)
            except OSError:  # another process won the race
                shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass  # a read-only cache only costs speed
    return tok


def converted_tokenizer_dir(path: Path) -> Path:
    """Where `gguf_tokenizer` keeps the converted tokenizer of the GGUF file at `path` (`save_pretrained` output)."""
    from jaxchat.assets import cache_dir

    st = path.stat()
    return cache_dir() / "tokenizers" / f"{path.stem}-{st.st_size}-{st.st_mtime_ns}"


def dequantized_cache_file(path: Path) -> Path | None:
    """Where the dequantised tensors of the GGUF file at `path` are cached (None: caching is off)."""
    return dequant_cache.cache_file(path)


def _convert(path: Path, cfg: ModelConfig, template: str | None, tensors: dict[str, Tensor], dtype, mesh,
             cache: Path | None):
    """Dequantise, fix up, assemble and place the GGUF's tensors: (graphdef, params). With a `cache` (and one
    process: a multi-host process reads only its own blocks), the float32 params are written there first."""
    desc = f"loading {path.name}"
    if cache is None or (mesh is not None and mesh.is_multi_process):
        return assemble(cfg, tensors, dtype, mesh, where=path.name, desc=desc)
    params = host_params(cfg, tensors, np.float32, where=path.name, desc=desc)
    dequant_cache.write_cache(cache, _named(params), _cache_metadata(cfg, template), path)
    return place(cfg, params, dtype, mesh)


def _named(params: dict[tuple[str, ...], np.ndarray]) -> dict[str, np.ndarray]:
    return {"/".join(p): a for p, a in params.items()}


def _cache_metadata(cfg: ModelConfig, template: str | None) -> dict[str, str]:
    return {"config": _config_json(cfg), "chat_template": template or ""}


def _config_json(cfg: ModelConfig) -> str:
    import dataclasses
    import json

    return json.dumps(dataclasses.asdict(cfg))


def _config_from_json(text: str) -> ModelConfig:
    import json

    return ModelConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(text).items()})


def open_cache(cache: Path | None):
    """The cache file's safetensors handle and metadata, or (None, None) when absent, unreadable or unchecked."""
    return dequant_cache.open_cache(cache)


def _gguf_tensors(path: Path, reader) -> tuple[ModelConfig, str | None, dict[str, Tensor]]:
    """The config, chat template and (lazily dequantised, HF-named) tensors of an open GGUF file."""
    names = {t.name for t in reader.tensors}
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise ModelLoadError(f"{path.name}: missing tensor 'token_embd.weight'")
    cfg = config_from_gguf(reader, names, int(embd.shape[-1]))
    arch = field(reader, "general.architecture")
    template = field(reader, "tokenizer.chat_template")
    heads = (cfg.num_heads, cfg.num_kv_heads)
    return cfg, template, {hf_name(t.name, arch): _tensor(t, t.name, arch, heads) for t in reader.tensors}


def fill_dequantized_cache(path: str | Path) -> Path | None:
    """Write the dequantised cache of the GGUF file at `path` now, without building the model (the asset fetch
    of scripts/bootstrap.sh does this, so a first `serve` maps the cache instead of dequantising). Returns the
    cache file, or None when caching is off or the cache could not be written; an existing cache is kept."""
    import gguf

    path = Path(path)
    cache = dequantized_cache_file(path)
    if cache is None or open_cache(cache)[0] is not None:
        return cache
    cfg, template, tensors = _gguf_tensors(path, gguf.GGUFReader(str(path)))
    params = host_params(cfg, tensors, np.float32, where=path.name, desc=f"converting {path.name}")
    written = dequant_cache.write_cache(cache, _named(params), _cache_metadata(cfg, template), path)
    return cache if written else None


def gguf_config(path: str | Path) -> ModelConfig:
    """The model config of a GGUF file, without its tensors: from the dequantised cache's metadata when there is
    one, else from the GGUF's own metadata."""
    import gguf

    path = Path(path)
    handle, meta = open_cache(dequantized_cache_file(path))
    if handle is not None:
        with handle:
            return _config_from_json(meta["config"])
    return _gguf_tensors(path, gguf.GGUFReader(str(path)))[0]


def load_gguf(path: str | Path, dtype="float32", mesh=None, tokenizer: bool = True, *,
              _read_cache: bool = True) -> LoadedModel:
    """A GGUF model; from the converted-weights cache (config and chat template included) when there is one,
    which also skips parsing the GGUF's metadata (tens of seconds for a 150k-token vocabulary): its params are
    placed straight from a memory map of it (on CPU without a copy). Its hashes are verified on a thread
    meanwhile, and the tokenizer loads on another; a cache that fails them (`dequant_cache.damage`), or whose
    params do not fit the model, is never served: what was placed from it is dropped, and the model is converted
    from the GGUF again (once: `_read_cache=False`), which writes a new cache (a warning says why)."""
    import gguf

    path = Path(path)
    cache = dequantized_cache_file(path)
    handle, meta = open_cache(cache) if _read_cache else (None, None)
    why, graphdef, params = None, None, None
    with concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="jaxchat-load") as pool:
        if handle is not None:
            with handle:  # the library has checked the file's layout
                cfg, template = _config_from_json(meta["config"]), meta.get("chat_template") or None
            tok = pool.submit(gguf_tokenizer, path, template) if tokenizer else None
            mapped = dequant_cache.mapped_params(cache)
            damaged = pool.submit(dequant_cache.damage, cache, meta, path, dict(mapped))
            try:
                graphdef, params = place(cfg, {tuple(name.split("/")): view for name, view in mapped.items()},
                                         dtype, mesh, where=str(cache))
            except ModelLoadError as exc:  # made for another layout of the params
                why = str(exc)
            why = why or damaged.result()
        else:
            cfg, template, tensors = _gguf_tensors(path, gguf.GGUFReader(str(path)))
            tok = pool.submit(gguf_tokenizer, path, template) if tokenizer else None
            graphdef, params = _convert(path, cfg, template, tensors, dtype, mesh, cache)
        tok = tok.result() if tok is not None and why is None else None
    if why is not None:
        log.warning("the converted-weights cache %s is not used: %s; converting %s again", cache, why, path.name)
        del graphdef, params
        with contextlib.suppress(OSError):
            cache.unlink()
        return load_gguf(path, dtype, mesh, tokenizer, _read_cache=False)
    return LoadedModel(cfg, graphdef, params, dtype, tokenizer=tok, chat_template=template,
                       eos_token_ids=cfg.eos_token_ids, bos_token_id=cfg.bos_token_id, mesh=mesh, source=str(path))
