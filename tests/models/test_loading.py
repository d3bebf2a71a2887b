"""Strict loading: missing / unmapped / wrongly-shaped tensors are errors naming the tensor; config parsing."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxchat.models import ModelLoadError, from_hf_config, load_model, to_hf_config
from jaxchat.models.gguf_loader import hf_name, unpermute
from tests.models.tiny_gguf import tiny_llama_gguf


def _rewrite(src, dst, edit):
    shutil.copytree(src, dst)
    f = dst / "model.safetensors"
    tensors = load_file(str(f))
    edit(tensors)
    save_file(tensors, str(f))
    return dst


def test_missing_tensor_is_named(tiny_dirs, tmp_path):
    d = _rewrite(tiny_dirs["llama"][0], tmp_path / "m", lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ModelLoadError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'"):
        load_model(d)


def test_unmapped_tensor_is_named(tiny_dirs, tmp_path):
    def add(t):
        t["model.layers.0.self_attn.extra.weight"] = np.zeros((4, 4), np.float32)

    d = _rewrite(tiny_dirs["qwen3"][0], tmp_path / "m", add)
    with pytest.raises(ModelLoadError, match=r"unmapped tensor 'model\.layers\.0\.self_attn\.extra\.weight'"):
        load_model(d)


def test_wrong_shape_is_named(tiny_dirs, tmp_path):
    def cut(t):
        t["model.layers.2.self_attn.k_proj.weight"] = t["model.layers.2.self_attn.k_proj.weight"][:-1]

    d = _rewrite(tiny_dirs["qwen2"][0], tmp_path / "m", cut)
    with pytest.raises(ModelLoadError, match=r"'model\.layers\.2\.self_attn\.k_proj\.weight' .*shape \(31, 64\)"):
        load_model(d)


def test_missing_bias_for_qwen2_is_named(tiny_dirs, tmp_path):
    d = _rewrite(tiny_dirs["qwen2"][0], tmp_path / "m", lambda t: t.pop("model.layers.0.self_attn.v_proj.bias"))
    with pytest.raises(ModelLoadError, match=r"v_proj\.bias"):
        load_model(d)


def test_unknown_gguf_tensor_is_named():
    assert hf_name("blk.3.attn_q.weight", "llama") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("blk.3.ffn_norm.weight", "gemma3") == "model.layers.3.pre_feedforward_layernorm.weight"
    with pytest.raises(ModelLoadError, match=r"'blk\.0\.attn_qkv\.weight'"):
        hf_name("blk.0.attn_qkv.weight", "llama")


def test_unpermute_inverts_llama_cpp_permutation():
    heads, hd, d = 3, 8, 5
    w = np.random.default_rng(0).normal(size=(heads * hd, d))
    # llama.cpp's converter: within each head, interleave the two rotary halves
    permuted = np.concatenate([np.stack([h[: hd // 2], h[hd // 2:]], axis=1).reshape(hd, d)
                               for h in np.split(w, heads)])
    np.testing.assert_array_equal(unpermute(permuted, heads), w)


def test_config_errors_name_the_field():
    with pytest.raises(ModelLoadError, match="model_type 'mamba'"):
        from_hf_config({"model_type": "mamba"})
    with pytest.raises(ModelLoadError, match="'intermediate_size'"):
        from_hf_config({"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2,
                                    "vocab_size": 4, "num_hidden_layers": 1})
    with pytest.raises(ModelLoadError, match="rope_type 'longrope'"):
        from_hf_config({"model_type": "llama", "hidden_size": 8, "num_attention_heads": 2,
                                    "vocab_size": 4, "num_hidden_layers": 1, "intermediate_size": 8,
                                    "rope_scaling": {"rope_type": "longrope", "factor": 4.0}})
    with pytest.raises(ModelLoadError, match="'num_local_experts'"):
        from_hf_config({"model_type": "gpt_oss", "hidden_size": 8, "num_attention_heads": 2,
                                    "vocab_size": 4, "num_hidden_layers": 1, "intermediate_size": 8,
                                    "sliding_window": 4, "num_experts_per_tok": 2})


@pytest.mark.parametrize("family", ["llama", "gemma3_text", "qwen3_moe", "gpt_oss", "gemma4_text"])
def test_config_round_trip(family, tiny_dirs):
    cfg = from_hf_config(json.loads((tiny_dirs[family][0] / "config.json").read_text()))
    back = from_hf_config(to_hf_config(cfg))
    assert back == cfg and hash(back) == hash(cfg)
    if family == "llama":
        assert cfg.rope_scaling["rope_type"] == "llama3"
    elif family == "qwen3_moe":  # transformers 5.x writes num_local_experts
        assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (8, 2, 32)
        assert cfg.norm_topk_prob and cfg.is_sparse == (True, True, True) and cfg.qk_norm
    elif family == "gpt_oss":
        assert cfg.rope_scaling["rope_type"] == "yarn" and cfg.rope_theta == 150000.0
        assert cfg.is_sliding == (True, False, True, False) and cfg.sliding_window == 8
        assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.swiglu_limit) == (8, 4, 1.0)
        assert cfg.attention_bias and cfg.o_bias and cfg.attention_sinks
    elif family == "gemma4_text":  # per layer type head dims and kv heads, KV sharing, the MoE block
        assert cfg.is_sliding == (True, True, False, True, True, False) and cfg.sliding_window == 8
        assert [cfg.layer_head_dim(i) for i in range(6)] == [16, 16, 32, 16, 16, 32]
        assert [cfg.layer_kv_heads(i) for i in range(6)] == [2, 2, 1, 2, 2, 1]
        assert cfg.kv_sources == (None, None, None, None, 3, 2)
        assert cfg.rope_scaling == {"rope_type": "proportional", "partial_rotary_factor": 0.25}
        assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (8, 2, 32)
        wrapped = {"model_type": "gemma4", "text_config": json.loads((tiny_dirs[family][0] / "config.json").read_text())}
        assert from_hf_config(wrapped) == cfg
    else:
        assert cfg.is_sliding == (True, False, True, False) and cfg.sliding_window == 8


def test_gemma4_config_errors_name_the_field(tiny_dirs):
    d = json.loads((tiny_dirs["gemma4_text"][0] / "config.json").read_text())
    for change, field in (({"per_layer_config": {"2": {"intermediate_size": 8}}}, "intermediate_size"),
                          ({"per_layer_config": {"9": {"head_dim": 8}}}, "per_layer_config key"),
                          ({"per_layer_config": {"2": {"head_dim": 8}}}, "different shapes"),
                          ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
                          ({"attention_bias": True}, "attention_bias"),
                          ({"num_kv_shared_layers": 6}, "num_kv_shared_layers"),
                          ({"enable_moe_block": True, "top_k_experts": None}, "top_k_experts"),
                          ({"rope_parameters": {"sliding_attention": {"rope_type": "yarn"}}}, "sliding_attention")):
        with pytest.raises(ModelLoadError, match=field):
            from_hf_config({**d, **change})
    # the published form: global_head_dim / num_global_key_value_heads instead of per_layer_config
    published = {k: v for k, v in d.items() if k != "per_layer_config"}
    published.update(global_head_dim=32, num_global_key_value_heads=1)
    assert from_hf_config(published) == from_hf_config(d)


def test_not_a_model(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(tmp_path / "nope")
    with pytest.raises(ModelLoadError, match="not a .gguf file"):
        load_model(tmp_path)


def test_gpt_oss_config_of_the_real_checkpoint():
    """openai/gpt-oss-20b's config.json (transformers 4.x layout: rope_scaling, experts_per_token, an
    MXFP4 quantization_config) reads to its architecture."""
    cfg = from_hf_config({
        "architectures": ["GptOssForCausalLM"], "attention_bias": True, "eos_token_id": 200002,
        "experts_per_token": 4, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880,
        "initial_context_length": 4096, "intermediate_size": 2880, "max_position_embeddings": 131072,
        "model_type": "gpt_oss", "num_attention_heads": 64, "num_experts_per_tok": 4, "num_hidden_layers": 24,
        "num_key_value_heads": 8, "num_local_experts": 32, "pad_token_id": 199999,
        "quantization_config": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                           "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"},
        "rms_norm_eps": 1e-05, "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                                                "original_max_position_embeddings": 4096, "rope_type": "yarn",
                                                "truncate": False},
        "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False,
        "vocab_size": 201088})
    assert (cfg.num_layers, cfg.num_experts, cfg.num_experts_per_tok, cfg.head_dim) == (24, 32, 4, 64)
    assert cfg.is_sliding[:4] == (True, False, True, False) and cfg.sliding_window == 128
    assert cfg.rope_scaling["rope_type"] == "yarn" and cfg.eos_token_ids == (200002,)
    assert from_hf_config(to_hf_config(cfg)) == cfg


def test_multimodal_gemma4_checkpoint_loads_its_text_decoder(tmp_path):
    """A `gemma4` checkpoint (Gemma4ForConditionalGeneration: the text model under model.language_model.)
    loads as gemma4_text and gives transformers' logits."""
    import numpy as np
    import torch
    import transformers as tf

    from .conftest import COMMON, GEMMA4
    from .paged import PagedRows

    torch.manual_seed(0)
    ref = tf.Gemma4ForConditionalGeneration(tf.Gemma4Config(text_config={**COMMON, **GEMMA4}, vision_config=None,
                                                            audio_config=None)).eval()
    ref.save_pretrained(tmp_path)
    lm = load_model(tmp_path)
    assert lm.config.family == "gemma4_text"
    ids = np.arange(12)[None] * 13 % 256
    with torch.no_grad():
        want = ref(input_ids=torch.tensor(ids)).logits.float().numpy()
    got = PagedRows(lm, 1, 16)(ids, np.arange(12)[None])
    assert np.abs(got - want).max() <= 1e-4


def test_gguf_dequantised_tensors_are_cached(tmp_path, monkeypatch):
    """The first load of a GGUF writes its dequantised tensors (with the config and chat template) to the asset
    cache; the next load reads them from there (dequantising and GGUF parsing are patched to fail) and gives
    the same config, template and params. Written ahead of any load (`fill_dequantized_cache`, what
    scripts/bootstrap.sh runs), the file is the same byte for byte, and an existing one is kept."""
    import gguf
    import gguf.quants
    import jax

    from jaxchat.models import gguf_loader

    path = tiny_llama_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setenv("JAXCHAT_CACHE", str(tmp_path))
    first = gguf_loader.load_gguf(path, tokenizer=False)
    cache = gguf_loader.dequantized_cache_file(path)
    assert cache.parent == tmp_path / "dequantized" and cache.exists()

    def refuse(*a, **k):
        raise AssertionError("dequantised again")

    monkeypatch.setattr(gguf.quants, "dequantize", refuse)
    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    second = gguf_loader.load_gguf(path, tokenizer=False)
    assert second.config == first.config and second.chat_template == first.chat_template and first.chat_template
    assert jax.tree.structure(first.params) == jax.tree.structure(second.params)
    for a, b in zip(jax.tree.leaves(first.params), jax.tree.leaves(second.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    monkeypatch.undo()  # the bootstrap's ahead-of-time fill (jaxchat.models.prepare_assets) writes the same file
    monkeypatch.setenv("JAXCHAT_CACHE", str(tmp_path))
    written_by_load = cache.read_bytes()
    cache.unlink()
    assert gguf_loader.fill_dequantized_cache(path) == cache and cache.read_bytes() == written_by_load
    stamp = cache.stat().st_mtime_ns
    assert gguf_loader.fill_dequantized_cache(path) == cache and cache.stat().st_mtime_ns == stamp  # kept
    monkeypatch.setenv("JAXCHAT_DEQUANT_CACHE", "0")
    assert gguf_loader.dequantized_cache_file(path) is None


def test_a_damaged_or_stale_converted_weights_cache_is_rebuilt_never_used(tmp_path, monkeypatch, caplog):
    """The cache holds the xxh3 hash of its source GGUF and of each param. A flipped byte in a param of the cache,
    or a GGUF replaced by another of the same size and mtime, is found on the next load: the cache is dropped
    and rebuilt from the GGUF (dequantised again), and the params equal a fresh conversion's."""
    import gguf.quants
    import jax

    from jaxchat.models import dequant_cache, gguf_loader

    source = tiny_llama_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setenv("JAXCHAT_CACHE", str(tmp_path))
    fresh = gguf_loader.load_gguf(source, tokenizer=False)
    cache = gguf_loader.dequantized_cache_file(source)
    handle, meta = dequant_cache.open_cache(cache)
    with handle:
        assert dequant_cache.damage(cache, meta, source) is None
    broken = {**meta, "param_xxh3": "not json"}  # a check that cannot run says so, and never raises
    assert dequant_cache.damage(cache, broken, source).startswith("its hashes could not be verified")
    edited = {**meta, "config": meta["config"].replace('"num_layers": ', '"num_layers": 1')}
    assert "its metadata" in dequant_cache.damage(cache, edited, source)
    (tmp_path / "dequantized" / "tiny-1-2-v2.safetensors").write_bytes(b"an old version's file")
    dequants = []
    real = gguf.quants.dequantize
    monkeypatch.setattr(gguf.quants, "dequantize", lambda *a, **k: dequants.append(1) or real(*a, **k))

    def reload_and_check(why: str, reference) -> None:
        dequants.clear()
        caplog.clear()
        again = gguf_loader.load_gguf(source, tokenizer=False)
        assert dequants and why in caplog.text  # converted again, and the log says why
        for a, b in zip(jax.tree.leaves(reference.params), jax.tree.leaves(again.params), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        handle, meta = dequant_cache.open_cache(cache)
        with handle:
            assert dequant_cache.damage(cache, meta, source) is None  # rebuilt whole

    with open(cache, "r+b") as f:  # one byte of the last param's data
        f.seek(-3, 2)
        byte = f.read(1)
        f.seek(-3, 2)
        f.write(bytes([byte[0] ^ 0x40]))
    reload_and_check("does not match its hash", fresh)
    assert not (tmp_path / "dequantized" / "tiny-1-2-v2.safetensors").exists()  # the stale sibling went
    stat = source.stat()
    reader = gguf.GGUFReader(str(source))
    start = int(reader.tensors[0].data_offset)  # one byte of the first tensor's data, same size and mtime
    with open(source, "r+b") as f:
        f.seek(start)
        byte = f.read(1)
        f.seek(start)
        f.write(bytes([byte[0] ^ 0x01]))
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert gguf_loader.dequantized_cache_file(source) == cache  # the same key: size and mtime cannot tell
    monkeypatch.setenv("JAXCHAT_DEQUANT_CACHE", "0")
    changed = gguf_loader.load_gguf(source, tokenizer=False)  # what the changed file converts to
    monkeypatch.setenv("JAXCHAT_DEQUANT_CACHE", "1")
    assert any((np.asarray(a) != np.asarray(b)).any()
               for a, b in zip(jax.tree.leaves(fresh.params), jax.tree.leaves(changed.params), strict=True))
    reload_and_check("is not the file it was made from", changed)


def test_the_converted_weights_cache_holds_the_params_and_places_them_from_its_memory_map_without_a_copy(
        tmp_path, monkeypatch, caplog):
    """The cache holds the assembled params; a second load maps the file once and, on CPU, each placed param is
    the map's memory itself (a 64-byte aligned, read-only view, equal to what the safetensors library reads): no
    host copy at all. Its params equal the first load's. A cache whose params do not fit the model (an older
    layout) is converted again, never placed."""
    import jax
    import jax.numpy as jnp

    from jaxchat.models import dequant_cache, gguf_loader

    source = tiny_llama_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setenv("JAXCHAT_CACHE", str(tmp_path))
    first = gguf_loader.load_gguf(source, tokenizer=False)  # dequantises, writes the cache
    cache = gguf_loader.dequantized_cache_file(source)
    reference = load_file(str(cache))
    names = {"/".join(str(k.key) for k in path) for path, _ in jax.tree_util.tree_flatten_with_path(first.params)[0]}
    assert set(reference) == names  # one entry per param, named by its path
    maps = []
    real_map = dequant_cache.mapped_params
    monkeypatch.setattr(dequant_cache, "mapped_params", lambda file: maps.append(real_map(file)) or maps[-1])
    second = gguf_loader.load_gguf(source, tokenizer=False)
    (mapped,) = maps
    assert set(mapped) == names
    for name, view in mapped.items():
        assert view.ctypes.data % dequant_cache.ALIGN == 0 and not view.flags.writeable and not view.flags.owndata
        np.testing.assert_array_equal(view, reference[name])
    placed = {"/".join(str(k.key) for k in path): leaf
              for path, leaf in jax.tree_util.tree_flatten_with_path(second.params)[0]}
    for name, leaf in placed.items():
        assert leaf.dtype == jnp.float32 and leaf.unsafe_buffer_pointer() == mapped[name].ctypes.data, name
    for a, b in zip(jax.tree.leaves(first.params), jax.tree.leaves(second.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    monkeypatch.undo()
    monkeypatch.setenv("JAXCHAT_CACHE", str(tmp_path))
    _, meta = dequant_cache.open_cache(cache)
    one_less = {name: np.asarray(v) for name, v in reference.items() if name != sorted(reference)[0]}
    given = {k: v for k, v in meta.items() if k in ("config", "chat_template")}
    assert dequant_cache.write_cache(cache, one_less, given, source)  # well-formed, hashes right, one param short
    caplog.clear()
    again = gguf_loader.load_gguf(source, tokenizer=False)
    assert "is missing" in caplog.text and "converting tiny.gguf again" in caplog.text
    assert set(load_file(str(cache))) == names  # rebuilt whole
    for a, b in zip(jax.tree.leaves(first.params), jax.tree.leaves(again.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_saved_gguf_tokenizer_loads_as_the_class_autotokenizer_picks_without_importing_torch():
    """A warm start reads the GGUF's converted tokenizer through the class its tokenizer_config.json names:
    AutoTokenizer's own lookup imports torch (seconds of a start), and the result must be the same tokenizer."""
    import subprocess
    import sys

    from jaxchat.assets import DEFAULT_MODEL, asset_path

    path = asset_path(DEFAULT_MODEL)
    if not path.exists():
        pytest.skip("the default model asset is not fetched (scripts/fetch_assets.py)")
    script = f"""
import sys
from pathlib import Path
from jaxchat.models.gguf_loader import gguf_tokenizer
tok = gguf_tokenizer(Path({str(path)!r}), None)
print(type(tok).__name__, "torch" in sys.modules)
"""
    run = [sys.executable, "-c", script]
    subprocess.run(run, check=True, capture_output=True, text=True)  # converts and saves it, if not yet saved
    name, torch_imported = subprocess.run(run, check=True, capture_output=True, text=True).stdout.split()
    assert torch_imported == "False"

    from transformers import AutoTokenizer

    from jaxchat.models.gguf_loader import converted_tokenizer_dir, gguf_tokenizer

    saved = converted_tokenizer_dir(path)
    reference, tok = AutoTokenizer.from_pretrained(str(saved)), gguf_tokenizer(path, None)
    assert name == type(tok).__name__ == type(reference).__name__
    text = "<|im_start|>user\nWhat's 2 + 2? ünïcode\t<tool_call>{\"a\": 1}</tool_call><|im_end|>"
    assert tok.encode(text) == reference.encode(text)
    messages = [{"role": "user", "content": "hi"}]
    assert (tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def test_a_saved_tokenizer_is_unpickled_on_later_loads_the_same_as_from_pretrained_and_read_afresh_when_stale(
        tmp_path, caplog):
    """`saved_tokenizer`: the first load of a saved tokenizer pickles it behind a version header; later loads
    unpickle it (no `from_pretrained`) into a tokenizer that encodes, decodes and renders the chat template as the
    saved folder does; a header of other versions or a broken file is read afresh and pickled again."""
    import pickle
    import shutil

    from transformers import AutoTokenizer

    from jaxchat.assets import DEFAULT_MODEL, asset_path
    from jaxchat.models import saved_tokenizer
    from jaxchat.models.gguf_loader import converted_tokenizer_dir

    path = asset_path(DEFAULT_MODEL)
    saved = converted_tokenizer_dir(path) if path.exists() else None
    if saved is None or not (saved / "tokenizer_config.json").exists():
        pytest.skip("the default model's tokenizer is not converted (python -m jaxchat.prepare)")
    folder = tmp_path / "saved"
    shutil.copytree(saved, folder, ignore=shutil.ignore_patterns(saved_tokenizer.PICKLE_NAME))
    reference = AutoTokenizer.from_pretrained(str(saved))
    cls = saved_tokenizer.saved_tokenizer_class(folder)
    calls = []
    real = cls.from_pretrained.__func__

    def counted(klass, *args, **kwargs):
        calls.append(args)
        return real(klass, *args, **kwargs)

    pickled = folder / saved_tokenizer.PICKLE_NAME
    text = "<|im_start|>user\nWhat's 2 + 2? ünïcode\t<tool_call>{\"a\": 1}</tool_call><|im_end|>"
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]

    def same_as_reference(tok) -> None:
        assert type(tok) is type(reference)
        assert tok.encode(text) == reference.encode(text)
        ids = reference.encode(text)
        assert tok.decode(ids, skip_special_tokens=False) == reference.decode(ids, skip_special_tokens=False)
        assert (tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
                == reference.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True))
        assert tok.all_special_ids == reference.all_special_ids and len(tok) == len(reference)

    from unittest import mock

    with mock.patch.object(cls, "from_pretrained", classmethod(counted)):
        same_as_reference(saved_tokenizer.load_saved_tokenizer(folder))
        assert len(calls) == 1 and pickled.exists()
        same_as_reference(saved_tokenizer.load_saved_tokenizer(folder))
        assert len(calls) == 1  # unpickled
        with open(pickled, "wb") as f:  # other versions wrote it
            pickle.dump(("jaxchat-tokenizer", 1, "0.0", "0.0"), f)
            pickle.dump("not a tokenizer", f)
        same_as_reference(saved_tokenizer.load_saved_tokenizer(folder))
        assert len(calls) == 2
        pickled.write_bytes(pickled.read_bytes()[:1000])  # cut short
        same_as_reference(saved_tokenizer.load_saved_tokenizer(folder))
        assert len(calls) == 3 and "could not unpickle" in caplog.text
        same_as_reference(saved_tokenizer.load_saved_tokenizer(folder))
        assert len(calls) == 3
