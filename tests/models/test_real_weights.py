"""Real GGUF weights agree with transformers loading the same GGUF (both dequantise to float32)."""

from __future__ import annotations

import contextlib
import functools
from unittest import mock

import numpy as np
import pytest
import torch

from jaxchat.models import load_model

from .paged import PagedRows

pytestmark = pytest.mark.slow

PROMPT = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
NEW = 32


def _asset(name: str):
    from jaxchat.assets import AssetError, asset_path

    try:
        return asset_path(name)
    except AssetError as e:  # pragma: no cover - depends on the machine's cache
        pytest.skip(str(e))


def _no_init():
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # pragma: no cover - older transformers
        import contextlib

        return contextlib.nullcontext()
    return no_init_weights()


@contextlib.contextmanager
def _each_gguf_parsed_once():
    """transformers builds a `gguf.GGUFReader` of the file for the config and again for the weights (parsing every
    metadata field, the tokenizer's vocabulary included: ~12 s of the 0.5B's ~48 s load here) and builds gguf's
    tensor-name map once per module: within one load both are the same pure reads, so they are made once."""
    import gguf

    readers: dict = {}
    real_reader = gguf.GGUFReader

    def reader(path, *args, **kwargs):
        key = (str(path), args, tuple(sorted(kwargs.items())))
        if key not in readers:
            readers[key] = real_reader(path, *args, **kwargs)
        return readers[key]

    with mock.patch.object(gguf, "GGUFReader", reader), \
            mock.patch.object(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map)):
        yield


def _hf_model(path):
    """transformers' own GGUF loading (config, dequantisation, renaming), in float32."""
    with _each_gguf_parsed_once():
        return _hf_model_loaded(path)


def _hf_model_loaded(path):
    import importlib.util

    from transformers import AutoConfig, AutoModelForCausalLM

    if importlib.util.find_spec("accelerate") is not None:
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                    dtype=torch.float32).eval()
    # from_pretrained(gguf_file=...) insists on accelerate; the same steps without it:
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    with _no_init():  # every weight is overwritten below: skip the random init
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    if missing:
        assert config.tie_word_embeddings
        model.tie_weights()
    return model.eval()


def jax_greedy(lm, ids: list[int], n: int) -> list[int]:
    """The prompt in one step, then one-token steps through the paged pool."""
    rows = PagedRows(lm, 1, len(ids) + n, page_size=16)
    logits = rows(np.asarray([ids]), np.arange(len(ids))[None])
    out = [int(logits[0, -1].argmax())]
    for i in range(n - 1):
        out.append(int(rows(np.asarray([[out[-1]]]), np.asarray([[len(ids) + i]]))[0, -1].argmax()))
    return out


def torch_greedy(model, ids: list[int], n: int) -> list[int]:
    out, past, x = [], None, torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            res = model(input_ids=x, past_key_values=past, use_cache=True)
            past = res.past_key_values
            out.append(int(res.logits[0, -1].argmax()))
            x = torch.tensor([[out[-1]]])
    return out


@pytest.mark.parametrize("name", ["smollm2-135m-instruct-q4_1.gguf", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"])
def test_gguf_greedy_matches_transformers(name):
    path = _asset(name)
    lm = load_model(path)
    assert lm.chat_template and lm.eos_token_ids
    ids = lm.tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True, return_dict=False)
    ours = jax_greedy(lm, ids, NEW)
    del lm
    theirs = torch_greedy(_hf_model(path), ids, NEW)
    assert ours == theirs


def test_gemma3_gguf_logits_close_to_transformers():
    path = _asset("gemma-3-270m-q4_k_m.gguf")
    lm = load_model(path)
    assert lm.config.family == "gemma3_text" and lm.config.is_sliding.count(False) == 3
    ids = lm.tokenizer("The capital of France is Paris. The capital of Italy is")["input_ids"]
    assert ids[0] == lm.bos_token_id
    # one step: its program compiles fast (31.5 s -> 28.4 s for this test alone, cold; the same logits)
    ours = PagedRows(lm, 1, len(ids), fast_compile=True)(np.asarray([ids]), np.arange(len(ids))[None])[0]
    del lm
    with torch.no_grad():
        ref = _hf_model(path)(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(ours - ref).max() <= 2e-3 * max(1.0, np.abs(ref).max())
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
