"""Listed layers (`layers.CausalLM.stacked = False`): a family whose blocks are kept per layer loads, shards,
saves and runs through the same code as a stacked one. Checked by listing the llama family's own blocks:
the listed model must give the stacked model's (and transformers') logits, through the paged pool as well."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from jaxchat.engine.attention_xla import XlaAttention
from jaxchat.models import llama as llama_module
from jaxchat.models import load_model, save_orbax
from jaxchat.models.entries import listed
from jaxchat.models.layers import CausalLM
from jaxchat.models.llama import LlamaBlock

from .conftest import build_tiny
from .paged import PagedRows

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
    """Logits of a full forward, and of prefill(split) then one-token steps, through the paged pool."""
    n = ids.shape[1]
    pos = np.arange(n)[None]
    full = PagedRows(lm, 1, 40)(ids, pos)
    rows = PagedRows(lm, 1, 40)
    parts = [rows(ids[:, :split], pos[:, :split])]
    parts += [rows(ids[:, t:t + 1], pos[:, t:t + 1]) for t in range(split, n)]
    return full, np.concatenate(parts, axis=1)


def test_listed_llama_equals_stacked_and_transformers(llama_dir, as_listed, tmp_path):
    d, ref_model = llama_dir
    ids = np.random.default_rng(3).integers(0, 256, (1, 32))
    with torch.no_grad():
        ref = ref_model(torch.tensor(ids)).logits.float().numpy()
    lm = load_model(d)
    assert not lm.stacked and isinstance(lm.params["layers"], tuple) and len(lm.params["layers"]) == 3
    pools = lm.new_pools(XlaAttention(4), 5, 4, 1, "stacked")  # the listed family's one layout, whatever asked
    assert isinstance(pools, tuple) and len(pools) == 3 and pools[0][0].shape == (5, 2, 16, 4)  # per layer, keys
    full, stepped = run(lm, ids, 20)
    assert np.abs(full - ref).max() <= TOL
    assert np.abs(stepped - ref).max() <= TOL
    step = lm.step_model(lm.params, "tpu")  # no stacked layout exists for a listed family, on any platform
    assert step.layout == "unrolled" and step.params is lm.params
    restored = load_model(save_orbax(lm, tmp_path / "orbax"))
    assert isinstance(restored.params["layers"], tuple)
    assert np.abs(run(restored, ids, 20)[1] - ref).max() <= TOL


def test_listed_cache_dims_give_each_layer_its_own_shape(llama_dir):
    """A layer whose cache_dims entry is None keeps no pool; others get pages of their own kv heads and head dim
    (keys [pages, KV, D, page], values [pages, KV, page, D]), or their recurrent state arrays [slots, ...]
    (`RecurrentState`, in its own dtype)."""
    from jaxchat.models import from_hf_config
    from jaxchat.models.base import RecurrentState, new_pools

    class Mixed(ListedLlama):
        @classmethod
        def cache_dims(cls, cfg):
            return ((cfg.num_kv_heads, cfg.head_dim), None, (1, 8))

    class WithState(ListedLlama):
        @classmethod
        def cache_dims(cls, cfg):
            return (RecurrentState(((64, 3), (4, 8, 8)), "float32"), (cfg.num_kv_heads, cfg.head_dim), None)

    cfg = from_hf_config(llama_dir[1].config.to_dict())
    backend = XlaAttention(4)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(llama_module, "Model", Mixed)
        mixed = new_pools(cfg, backend, 6, 4, 2)
        mp.setattr(llama_module, "Model", WithState)
        state = new_pools(cfg, backend, 6, 4, 2, "bfloat16")
    assert [tuple(c.shape for c in layer) for layer in mixed] == [((6, 2, 16, 4), (6, 2, 4, 16)), (),
                                                                  ((6, 1, 8, 4), (6, 1, 4, 8))]
    assert [tuple((c.shape, str(c.dtype)) for c in layer) for layer in state] == [
        (((2, 64, 3), "float32"), ((2, 4, 8, 8), "float32")),
        (((6, 2, 16, 4), "bfloat16"), ((6, 2, 4, 16), "bfloat16")), ()]


def test_engine_runs_a_listed_model_like_the_stacked_one(llama_dir, monkeypatch):
    """Continuous batching (joins, an abort) over a listed model gives the stacked model's greedy tokens."""
    from jaxchat.engine.engine import Engine
    from tests.engine.test_real_model import isolation_plan, run_plan

    plan = isolation_plan([11, 12, 13, 14, 15], 10)
    shapes = {"max_batch": 4, "max_context": 48, "decode_rows": (4,), "max_step_tokens": 32}  # few programs
    stacked = run_plan(Engine(load_model(llama_dir[0]), **shapes, start=False), plan)
    stacked_table = llama_module.hf_entries
    monkeypatch.setattr(llama_module, "Model", ListedLlama)
    monkeypatch.setattr(llama_module, "hf_entries", lambda cfg: listed(stacked_table(cfg)))
    engine = Engine(load_model(llama_dir[0]), **shapes, start=False)
    assert run_plan(engine, plan) == stacked
    assert engine.stats().compiles_on_request_path == 0
