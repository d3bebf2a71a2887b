"""LFM2 and LFM2-MoE beyond the shared parity tests: config parsing (4.x aliases, the MLP size adjustment),
strict expert tables, the conv state's rules (reset at position 0, padding never enters it, a step's rows in
state slots of a bigger pool), and the engine: batch isolation with state, transformers' greedy tokens, no recompiles."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
import torch

from jaxchat.models import ModelLoadError, from_hf_config, load_model, to_hf_config

from .paged import PagedRows
from .test_loading import _rewrite

TOL = 1e-4


@pytest.mark.parametrize("family", ["lfm2", "lfm2_moe"])
def test_config_round_trip(family, tiny_dirs):
    cfg = from_hf_config(json.loads((tiny_dirs[family][0] / "config.json").read_text()))
    assert cfg.layer_types == ("conv", "full_attention", "conv", "full_attention") and cfg.qk_norm
    back = from_hf_config(to_hf_config(cfg))
    assert back == cfg and hash(back) == hash(cfg)
    if family == "lfm2":
        assert cfg.intermediate_size == 96  # int(2 * 128 / 3) = 85, rounded up to block_multiple_of 32
    else:
        assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.num_dense_layers, cfg.use_expert_bias) == (8, 2, 1, True)


def test_lfm2_4x_config_aliases_and_errors():
    base = {"model_type": "lfm2", "vocab_size": 256, "hidden_size": 64, "num_attention_heads": 4,
            "num_key_value_heads": 2, "num_hidden_layers": 4}
    cfg = from_hf_config({**base, "block_ff_dim": 12288, "tie_embedding": False, "full_attn_idxs": [1, 3],
                                      "rope_theta": 1000000.0, "norm_eps": 1e-5})
    assert cfg.layer_types == ("conv", "full_attention", "conv", "full_attention")
    assert cfg.intermediate_size == 8192 and not cfg.tie_word_embeddings and cfg.rope_theta == 1e6
    assert from_hf_config({**base, "intermediate_size": 96, "block_auto_adjust_ff_dim": False}).intermediate_size == 96
    with pytest.raises(ModelLoadError, match="layer_types entry 'mamba'"):
        from_hf_config({**base, "intermediate_size": 8, "layer_types": ["conv", "mamba", "conv", "conv"]})
    with pytest.raises(ModelLoadError, match="'layer_types'"):
        from_hf_config({**base, "model_type": "lfm2_moe", "intermediate_size": 8, "num_experts": 4,
                                    "num_experts_per_tok": 2, "moe_intermediate_size": 8})


def test_missing_expert_and_unmapped_tensors_are_named(tiny_dirs, tmp_path):
    src = tiny_dirs["lfm2_moe"][0]
    d = _rewrite(src, tmp_path / "a", lambda t: t.pop("model.layers.3.feed_forward.experts.5.w3.weight"))
    with pytest.raises(ModelLoadError, match=r"missing tensor 'model\.layers\.3\.feed_forward\.experts\.5\.w3\.weight'"):
        load_model(d)

    def add(t):
        t["model.layers.0.conv.conv.bias"] = np.zeros((64,), np.float32)  # conv_bias is false

    with pytest.raises(ModelLoadError, match=r"unmapped tensor 'model\.layers\.0\.conv\.conv\.bias'"):
        load_model(_rewrite(src, tmp_path / "b", add))


def test_conv_state_rows_reset_and_padding(tiny_dirs):
    """Rows 1..2 of a 4-row pool (state slots and pages): row 1 prefills a prompt (padding after it) over a
    stale state, row 2 is idle (all padding) and keeps its state; then row 1 decodes on. Equals transformers
    on the prompt."""
    lm = load_model(tiny_dirs["lfm2"][0])
    ref_model = tiny_dirs["lfm2"][1]
    prompt = np.random.default_rng(7).integers(0, 256, 9)
    rows = PagedRows(lm, 4, 24)
    rows.pools = jax.tree.map(lambda a: a + 5.0, rows.pools)

    def conv_states():  # [slots, d, L-1] per conv layer
        return [np.asarray(entry[0]) for entry in rows.pools if len(entry) == 1 and entry[0].ndim == 3]

    before = conv_states()
    assert len(before) == 2 and before[0].shape[0] == 4
    toks = np.zeros((2, 12), np.int32)
    pos = -np.ones((2, 12), np.int32)
    toks[0, :9], pos[0, :9] = prompt, np.arange(9)
    logits = rows(toks, pos, first_row=1)
    with torch.no_grad():
        ref = ref_model(torch.tensor(np.concatenate([prompt, [42]])[None])).logits.numpy()[0]
    assert np.abs(logits[0, :9] - ref[:9]).max() <= TOL
    after = conv_states()
    for b, a in zip(before, after, strict=True):
        np.testing.assert_array_equal(a[[0, 2, 3]], b[[0, 2, 3]])  # other rows and the idle row untouched
        assert np.abs(a[1] - b[1]).min() > 0  # row 1's slot now holds its prompt's state
    step = rows(np.array([[42], [0]]), np.array([[9], [-1]]), first_row=1)
    assert np.abs(step[0, 0] - ref[9]).max() <= TOL


@pytest.mark.parametrize("family", ["lfm2", "lfm2_moe"])
def test_engine_isolation_greedy_parity_and_no_recompiles(family, tiny_dirs):
    """A prompt decoded alone equals the same prompt decoded while 3 others join and leave (one aborted), and
    equals transformers' greedy `generate`; nothing compiles after warm-up."""
    from jaxchat.engine.engine import Engine
    from tests.engine.test_real_model import greedy, isolation_plan, run_plan

    d, ref_model = tiny_dirs[family]
    prompt = [11, 12, 13, 14, 15, 16, 17]
    engine = Engine(load_model(d), max_batch=4, max_context=48, max_step_tokens=32, start=False)
    alone = run_plan(engine, {0: [("submit", greedy("p", prompt, 14))]})["p"]
    mixed = run_plan(engine, isolation_plan(prompt, 14))
    assert mixed["p"] == alone
    with torch.no_grad():
        want = ref_model.generate(torch.tensor([prompt]), max_new_tokens=14, do_sample=False,
                                  pad_token_id=0)[0, len(prompt):].tolist()
    assert len(want) == 14 and alone == want  # (no eos among them: HF would stop there)
    assert engine.stats().compiles_on_request_path == 0


def test_moe_many_assignments_match_transformers(tiny_dirs):
    """5 x 32 tokens, 2 experts each: more assignments than `moe.SCAN_MAX_ROWS`, so the experts run as one
    grouped `ragged_dot` instead of the per-row scan; the logits still equal transformers'."""
    from jaxchat.models.moe import SCAN_MAX_ROWS

    d, ref_model = tiny_dirs["lfm2_moe"]
    lm = load_model(d)
    ids = np.random.default_rng(5).integers(0, 256, (5, 32))
    assert ids.size * lm.config.num_experts_per_tok > SCAN_MAX_ROWS
    with torch.no_grad():
        ref = ref_model(torch.tensor(ids)).logits.numpy()
    logits = PagedRows(lm, 5, 40)(ids, np.broadcast_to(np.arange(32), (5, 32)))
    assert np.abs(logits - ref).max() <= TOL
