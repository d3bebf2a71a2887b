"""One small call of the Pallas attention kernel on one device, against JAX's reference: the check
`tpu_setup.sh` runs on every chip (the kernel compiles and computes there, not only jax).

Contract: `kernel_error(device) -> float`: the largest absolute difference between `attention_tpu.ragged_attention`
and `attention_tpu.ragged_attention_reference` on random bf16 inputs placed on `device` (two rows, one decoding
and one running a chunk, over pages of 16 tokens, 8 query heads over 1 kv head, head_dim 128). A correct kernel
gives about 1e-2 at most (bf16). Off TPU it needs Pallas' interpreter (`pallas_interpret.enable()`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxchat.engine import attention_tpu

TOLERANCE = 5e-2


def kernel_error(device) -> float:
    rng = np.random.default_rng(0)
    page, pages, heads, kv_heads, dim = 16, 8, 8, 1, 128
    runs = [(1, 21), (7, 30)]  # (queries, context) per row
    tables = np.asarray([[1, 2], [3, 4]], np.int32)
    cu = np.cumsum([0] + [n for n, _ in runs]).astype(np.int32)
    kv_lens = np.asarray([length for _, length in runs], np.int32)
    tokens = int(cu[-1])

    def put(x, dtype):
        return jax.device_put(jnp.asarray(x, dtype), device)

    q = put(rng.standard_normal((tokens, heads, dim)), jnp.bfloat16)
    kv = put(rng.standard_normal((pages, page, 2 * kv_heads, dim)), jnp.bfloat16)
    args = (q, kv, put(kv_lens, jnp.int32), put(tables, jnp.int32), put(cu, jnp.int32), put([2], jnp.int32))
    got = attention_tpu.ragged_attention(*args, scale=dim ** -0.5)
    want = attention_tpu.ragged_attention_reference(*args, scale=dim ** -0.5)
    return float(jnp.max(jnp.abs(got.astype(jnp.float32) - want.astype(jnp.float32))))
