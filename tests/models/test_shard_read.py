"""Reading a block of a param from a checkpoint (multi-host loading, `shard_read`): for every family's tiny
checkpoint and every table entry, a block cut along any one axis of the param equals the whole tensor
converted and cut, and where the layout allows it fewer bytes are read than the tensor holds."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxchat.models import FAMILIES, from_hf_config
from jaxchat.models.families import abstract_model, table
from jaxchat.models.hf_loader import gemma_text_tensors, read_safetensors, safetensors_files, text_decoder_tensors
from jaxchat.models.shard_read import needed_box, read_block
from jaxchat.models.weights import _entry_target, _leaf_shapes


def checkpoint(directory):
    hf_config = json.loads((directory / "config.json").read_text())
    cfg = from_hf_config(hf_config)
    tensors = text_decoder_tensors(cfg, gemma_text_tensors(hf_config, read_safetensors(safetensors_files(directory))))
    return cfg, tensors


@pytest.mark.parametrize("family", FAMILIES)
def test_a_block_cut_along_any_axis_equals_the_converted_tensor_cut(family, tiny_dirs):
    from jaxchat.models.entries import convert

    cfg, tensors = checkpoint(tiny_dirs[family][0])
    if any(n.endswith(("_blocks", "_scales")) for n in tensors):
        pytest.skip("MXFP4 pairs are folded before assembly (their folded tensors have no slice reader)")
    shapes = _leaf_shapes(abstract_model(cfg, "float32")[1])
    partial = 0
    for e in table(cfg, frozenset(tensors)).values():
        _, target, _ = _entry_target(e, shapes[e.path][0])
        full = convert(np.asarray(tensors[e.hf].load()), e, target)
        for axis, size in enumerate(target):
            for lo, hi in ((0, size // 2), (size // 2, size)) if size > 1 else ():
                box = tuple((lo, hi) if i == axis else (0, d) for i, d in enumerate(target))
                block, nbytes = read_block(tensors[e.hf], e, target, box)
                np.testing.assert_array_equal(block, full[tuple(slice(a, b) for a, b in box)], err_msg=e.hf)
                partial += nbytes < full.nbytes
    assert partial > 0, f"{family}: no block was read as a slice"


def test_the_box_a_process_needs_covers_its_devices_indices():
    """On one process the box is the whole param; a box over some devices of a sharded param is their range."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
    assert needed_box(NamedSharding(mesh, P(None, "tp")), (4, 6)) == ((0, 4), (0, 6))


def test_heads_split_over_processes_read_their_own_rows(tiny_dirs):
    """The q projection's rows for the first half of the kv heads are the first half of its rows (Qwen2
    layout: q heads grouped under their kv head), read as a slice."""
    cfg, tensors = checkpoint(tiny_dirs["qwen2"][0])
    shapes = _leaf_shapes(abstract_model(cfg, "float32")[1])
    entry = next(e for e in table(cfg, frozenset(tensors)).values() if e.hf.endswith("layers.0.self_attn.q_proj.weight"))
    _, target, _ = _entry_target(entry, shapes[entry.path][0])
    kv = target[1]
    box = tuple((0, kv // 2) if i == 1 else (0, d) for i, d in enumerate(target))
    _, nbytes = read_block(tensors[entry.hf], entry, target, box)
    assert nbytes * 2 == np.asarray(tensors[entry.hf].load()).nbytes
