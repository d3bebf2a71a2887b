"""`bench/int8_ceiling.py` sorts a decode step's ops into weight matmuls and the rest: on a tiny dense model
it finds exactly the step's weight matmuls (per layer qkv, o, gate/up and down, plus the lm head), in fp32
and int8 alike, and a profiled step has time on both sides."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import int8_ceiling  # noqa: E402
from bench.decode import random_model_of  # noqa: E402

TINY = {"family": "qwen2", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_layers": 2,
        "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "rope_theta": 1e4, "attention_bias": True,
        "tie_word_embeddings": True}


def tiny_model(quantize: str | None):
    from jaxchat.models.load import quantized

    return quantized(random_model_of(TINY, "float32"), quantize)


@pytest.mark.parametrize("quantize", [None, "int8"])
@pytest.mark.parametrize("batch", [1, 4])
def test_weight_matmuls_are_the_steps_projections(quantize, batch):
    model = tiny_model(quantize)
    fn, args = int8_ceiling.step_program(model, batch, 32)
    found = int8_ceiling.weight_matmuls(fn)
    assert len(found) == 4 * TINY["num_layers"] + 1, sorted(found)
    wall, matmul, rest = int8_ceiling.profile_step(model, batch, 32, steps=2)
    assert wall > 0 and matmul > 0 and rest > 0
