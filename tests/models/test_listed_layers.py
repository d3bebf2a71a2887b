"""Listed layers (`layers.CausalLM.stacked = False`): a family whose blocks are kept per layer loads, shards,
saves and runs through the same code as a stacked one. Checked by listing the llama family's own blocks:
the listed model must give the stacked model's (and transformers') logits, through the cache as well."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from jaxchat.models import empty_cache, load_model, save_orbax
from jaxchat.models import llama as llama_module
from jaxchat.models.entries import listed
from jaxchat.models.layers import CausalLM
from jaxchat.models.llama import LlamaBlock

from .conftest import build_tiny

TOL = 1e-4


class ListedLlama(CausalLM):
    block_cls = LlamaBlock
    stacked = False


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("listed-llama")
    return d, build_tiny("llama", d)


@pytest.fixture
def as_listed(monkeypatch):
    stacked_table = llama_module.hf_entries
    monkeypatch.setattr(llama_module, "Model", ListedLlama)
    monkeypatch.setattr(llama_module, "hf_entries", lambda cfg: listed(stacked_table(cfg)))


def run(lm, ids, split: int):
    """Logits of a full forward, and of prefill(split) then one-token decodes, through `empty_cache`."""
    fwd = jax.jit(lm.forward)
    toks, n = jnp.asarray(ids, jnp.int32), ids.shape[1]
    pos = jnp.arange(n, dtype=jnp.int32)[None]
    full, _, _ = fwd(lm.params, toks, pos, *empty_cache(lm.config, 1, 40, jnp.float32))
    ck, cv = empty_cache(lm.config, 1, 40, jnp.float32)
    out, ck, cv = fwd(lm.params, toks[:, :split], pos[:, :split], ck, cv)
    parts = [np.asarray(out)]
    for t in range(split, n):
        out, ck, cv = fwd(lm.params, toks[:, t:t + 1], pos[:, t:t + 1], ck, cv)
        parts.append(np.asarray(out))
    return np.asarray(full), np.concatenate(parts, axis=1)


def test_listed_llama_equals_stacked_and_transformers(llama_dir, as_listed, tmp_path):
    d, ref_model = llama_dir
    ids = np.random.default_rng(3).integers(0, 256, (1, 32))
    with torch.no_grad():
        ref = ref_model(torch.tensor(ids)).logits.float().numpy()
    lm = load_model(d)
    assert not lm.stacked and isinstance(lm.params["layers"], tuple) and len(lm.params["layers"]) == 3
    ck, _ = empty_cache(lm.config, 1, 8)
    assert isinstance(ck, tuple) and ck[0][0].shape == (1, 2, 16, 8)  # per layer, keys [B, KV, D, S]
    full, stepped = run(lm, ids, 20)
    assert np.abs(full - ref).max() <= TOL
    assert np.abs(stepped - ref).max() <= TOL
    step = lm.step_model(lm.params, "tpu")  # no stacked layout exists for a listed family, on any platform
    assert step.layout == "unrolled" and step.params is lm.params
    restored = load_model(save_orbax(lm, tmp_path / "orbax"))
    assert isinstance(restored.params["layers"], tuple)
    assert np.abs(run(restored, ids, 20)[1] - ref).max() <= TOL


def test_listed_cache_dims_give_each_layer_its_own_shape(llama_dir):
    """A layer whose cache_dims entry is None keeps no cache; others get their own kv heads and head dim, or
    their recurrent state arrays (`RecurrentState`); attention spans are read off the KV-cache layers."""
    from jaxchat.models import ModelConfig
    from jaxchat.models.base import RecurrentState, layer_cache
    from jaxchat.models.layers import attention_span

    class Mixed(ListedLlama):
        @classmethod
        def cache_dims(cls, cfg):
            return ((cfg.num_kv_heads, cfg.head_dim), None, (1, 8))

    class WithState(ListedLlama):
        @classmethod
        def cache_dims(cls, cfg):
            return (RecurrentState(((64, 3), (4, 8, 8)), "float32"), (cfg.num_kv_heads, cfg.head_dim), None)

    cfg = ModelConfig.from_hf_config(llama_dir[1].config.to_dict())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(llama_module, "Model", Mixed)
        ck, cv = layer_cache(cfg, 2, 12, spans=(4,))
        assert attention_span(cv, 3, per_layer=True) == 4
        mp.setattr(llama_module, "Model", WithState)
        sk, sv = layer_cache(cfg, 2, 12, "bfloat16", spans=(4,))
        assert attention_span(sv, 5, per_layer=True) == 12  # read off the first layer with a KV cache
    assert [tuple(c.shape for c in layer) for layer in ck] == [((2, 2, 16, 4), (2, 2, 16, 8)), (), ((2, 1, 8, 4), (2, 1, 8, 8))]
    assert [tuple(c.shape for c in layer) for layer in cv] == [((2, 2, 4, 16), (2, 2, 8, 16)), (), ((2, 1, 4, 8), (2, 1, 8, 8))]
    assert [tuple((c.shape, str(c.dtype)) for c in layer) for layer in sk] == [
        (((2, 64, 3), "float32"), ((2, 4, 8, 8), "float32")), (((2, 2, 16, 4), "bfloat16"), ((2, 2, 16, 8), "bfloat16")), ()]
    assert [len(layer) for layer in sv] == [0, 2, 0]


def test_engine_runs_a_listed_model_like_the_stacked_one(llama_dir, monkeypatch):
    """Continuous batching (joins, an abort) over a listed model gives the stacked model's greedy tokens."""
    from jaxchat.engine.engine import Engine
    from tests.engine.test_real_model import isolation_plan, run_plan

    plan = isolation_plan([11, 12, 13, 14, 15], 10)
    stacked = run_plan(Engine(load_model(llama_dir[0]), max_batch=4, max_context=48, start=False), plan)
    stacked_table = llama_module.hf_entries
    monkeypatch.setattr(llama_module, "Model", ListedLlama)
    monkeypatch.setattr(llama_module, "hf_entries", lambda cfg: listed(stacked_table(cfg)))
    engine = Engine(load_model(llama_dir[0]), max_batch=4, max_context=48, start=False)
    assert run_plan(engine, plan) == stacked
    assert engine.stats()["compiles_after_warmup"] == 0
