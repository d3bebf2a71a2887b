"""`--attention pallas` against `--attention xla`: the same greedy tokens from the engine, on tiny random
checkpoints of two families (Qwen3, and Gemma 3 with its sliding windows and soft-capped logits), the Pallas TPU
kernel running under the TPU interpreter on CPU. Also how the backend is chosen and refused."""

from __future__ import annotations

import pytest

from jaxchat.engine import attention_tpu
from jaxchat.engine.attention_xla import XlaAttention
from jaxchat.engine.engine import Engine, attention_backend
from jaxchat.engine.types import GenerationRequest, SamplingParams
from jaxchat.models.config import ModelConfig
from jaxchat.models.load import load_model
from tests.models.conftest import build_tiny

pytestmark = pytest.mark.slow

try:
    from jaxchat.engine import pallas_interpret

    pallas_interpret._modules()
except RuntimeError as e:  # another jax: the interpreter's internals moved
    pytest.skip(str(e), allow_module_level=True)



@pytest.fixture(autouse=True, scope="module")
def unpatch_afterwards():
    """The kernel engines patch the interpreter for the process; undo it so later tests on this worker see jax's own."""
    yield
    pallas_interpret.disable()


PROMPTS = [[5, 9, 17, 33, 2, 8, 61, 7, 12, 40, 3], [100, 101, 7], [9] * 20]


def generate(engine: Engine) -> list[list[int]]:
    sched, got = engine.scheduler, {}
    for i, prompt in enumerate(PROMPTS):
        got[i] = []
        sched.submit(GenerationRequest(prompt, SamplingParams(max_tokens=5, ignore_eos=True), request_id=str(i)),
                     got[i].append)
    while engine.core.has_work():
        engine.core.step()
    return [[t for out in got[i] for t in out.token_ids] for i in range(len(PROMPTS))]


@pytest.mark.parametrize("family", ["qwen3", "gemma3_text"])
def test_pallas_kernel_gives_the_xla_backends_greedy_tokens(family, tmp_path):
    build_tiny(family, tmp_path, head_dim=128, num_hidden_layers=2)
    model = load_model(tmp_path, "float32")
    shapes = {"max_batch": 4, "max_context": 64, "step_token_buckets": (64,), "decode_rows": (4,), "start": False,
              "warmup": False, "page_size": 16}
    xla = Engine(model, **shapes, attention="xla")
    kernel = Engine(model, **shapes, attention="pallas")
    try:
        assert isinstance(kernel.runner.backend, attention_tpu.PallasAttention) and kernel.runner.backend.interpret
        assert isinstance(xla.runner.backend, XlaAttention)
        want = generate(xla)
        assert generate(kernel) == want and all(len(tokens) == 5 for tokens in want)
    finally:
        xla.shutdown()
        kernel.shutdown()


def test_auto_is_the_kernel_on_tpu_only_and_unsupported_models_are_refused():
    small = ModelConfig(family="qwen3", vocab_size=64, hidden_size=64, intermediate_size=64, num_layers=1,
                        num_heads=2, num_kv_heads=1, head_dim=64)
    wide = ModelConfig(family="qwen3", vocab_size=64, hidden_size=64, intermediate_size=64, num_layers=1,
                       num_heads=2, num_kv_heads=1, head_dim=128)
    assert isinstance(attention_backend("auto", wide, "cpu", 16), XlaAttention)
    assert isinstance(attention_backend("auto", small, "tpu", 64), XlaAttention)  # head_dim 64: the jnp path
    tpu = attention_backend("auto", wide, "tpu", 64)
    assert isinstance(tpu, attention_tpu.PallasAttention) and not tpu.interpret
    with pytest.raises(ValueError, match="head_dim"):
        attention_backend("pallas", small, "cpu", 16)
    with pytest.raises(ValueError, match="choose one of"):
        attention_backend("flash", wide, "cpu", 16)
