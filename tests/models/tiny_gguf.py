"""A tiny random llama GGUF written with the `gguf` library: Q4_1 matrices (what SmolLM2's asset holds), float32
norms, a chat template and bos/eos ids, 2 layers of hidden 64 over 64 token ids.

`tiny_llama_gguf(path)` writes it (a few KiB: loading, dequantising and caching it take milliseconds, where the
135M asset takes seconds) for tests of the GGUF loading path itself: the converted-weights cache, its checksums.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def tiny_llama_gguf(path: str | Path, *, vocab: int = 64, hidden: int = 64, ffn: int = 128, layers: int = 2,
                    heads: int = 4, kv_heads: int = 2, seed: int = 0) -> Path:
    import gguf
    import gguf.quants

    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(TEMPLATE)
    q4_1 = gguf.GGMLQuantizationType.Q4_1

    def matrix(name: str, rows: int, cols: int) -> None:
        data = gguf.quants.quantize((rng.standard_normal((rows, cols)) * 0.05).astype(np.float32), q4_1)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=q4_1)

    def norm(name: str) -> None:
        writer.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))

    head_dim = hidden // heads
    matrix("token_embd.weight", vocab, hidden)
    for i in range(layers):
        norm(f"blk.{i}.attn_norm.weight")
        matrix(f"blk.{i}.attn_q.weight", heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        matrix(f"blk.{i}.attn_output.weight", hidden, heads * head_dim)
        norm(f"blk.{i}.ffn_norm.weight")
        matrix(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_up.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_down.weight", hidden, ffn)
    norm("output_norm.weight")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
