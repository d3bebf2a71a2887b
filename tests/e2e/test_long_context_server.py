"""`jaxchat serve --max-batch 64 --max-context 32768` with the default model's KV geometry, on this machine.

Reserving 64 rows of 32k tokens (24 KiB of fp32 KV each) would take 48 GiB; the paged pool holds what the
tokens in use need. The server starts with its pool sized by memory (the start-up log says how many tokens it
holds) and stays far below that in memory, serves 48 concurrent requests whose greedy replies equal the same
requests sent alone, and answers a prompt of more than 16k tokens.

What is checked depends on the KV geometry, not on the weights: the model served is a random Qwen2 with the
default model's KV layout (24 layers x 2 KV heads x head_dim 64, so the same bytes per token, pool, pages and
chunks) and the real Qwen2.5 tokenizer, but a hidden size of 128 and 2 query heads, so its 16k prefill costs a
small fraction of the real model's FLOPs. The same run on the real weights is `bench/long_context.py`. The server
compiles decode programs of 1, 8 and 64 rows only and no verify program (`--decode-rows`, `--speculative off`):
neither changes the pool, the pages or the chunks.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from tests.serve_process import start_serve, stop
from tests.tiny_model import tiny_chat_model

pytestmark = pytest.mark.slow

# Qwen2.5-0.5B's KV geometry (its config: 24 layers, 2 KV heads, head_dim 64), a small everything else.
MODEL_DIR = "long-context-kv-geometry-v1"  # under the asset cache; also the model id it is served as
KV_GEOMETRY = {"num_hidden_layers": 24, "num_key_value_heads": 2, "head_dim": 64}


def kv_geometry_model(vocab_size: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=256, num_attention_heads=2,
        max_position_embeddings=32768, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645,
        **KV_GEOMETRY))


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from jaxchat.assets import cache_dir

    model = tiny_chat_model(cache_dir() / MODEL_DIR, model=kv_geometry_model)
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    # decode programs of 1, 8 and 64 rows, no speculation: 13 programs instead of 22 (what is checked is the pool)
    proc, base = start_serve(["--model", str(model), "--max-batch", "64", "--max-context", "32768",
                              "--decode-rows", "1,8,64", "--speculative", "off"], log, timeout=1800)
    yield proc, base, log
    stop(proc)


def prompts(n: int) -> list[list[int]]:
    """n distinct prompts of 5..60 token ids (plain text ids of the Qwen2.5 vocabulary)."""
    return [[(97 * i + 13 * j) % 5000 + 200 for j in range(5 + (7 * i) % 56)] for i in range(n)]


async def complete(client: httpx.AsyncClient, base: str, prompt: list[int], max_tokens: int) -> dict:
    r = await client.post(base + "/v1/completions", json={
        "model": MODEL_DIR, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_model_has_the_default_models_kv_geometry(server):
    """Same KV bytes per token as Qwen2.5-Coder-0.5B-Instruct (its GGUF's metadata), hence the same pool."""
    import gguf

    from jaxchat.assets import DEFAULT_MODEL, asset_path

    _, _, log = server
    meta = gguf.GGUFReader(asset_path(DEFAULT_MODEL)).fields
    value = lambda key: int(meta[key].parts[meta[key].data[0]][0])  # noqa: E731
    heads, hidden = value("qwen2.attention.head_count"), value("qwen2.embedding_length")
    assert KV_GEOMETRY == {"num_hidden_layers": value("qwen2.block_count"),
                           "num_key_value_heads": value("qwen2.attention.head_count_kv"), "head_dim": hidden // heads}
    assert "Chat format: hermes_json" in Path(log).read_text()


def test_the_pool_is_sized_by_memory_not_by_rows_times_context(server):
    proc, _, log = server
    found = re.search(r"KV pool: (\d+) pages of (\d+) tokens \((\d+) tokens, ([\d.]+) GiB\)", log.read_text())
    assert found, log.read_text()[-2000:]
    tokens, gib = int(found.group(3)), float(found.group(4))
    assert 32768 < tokens < 64 * 32768 and gib <= 4.5  # holds a long prompt and many short ones, not 48 GiB
    # 3 decode, 7 ragged, 3 samplers: the first ragged one, the 64-row decode and their sampler before serving (the
    # others behind, or, in the test run, never: JAXCHAT_PROGRAMS=first, tests/conftest.py)
    assert re.search(r"Warm-up: 3 of 13 programs", log.read_text())
    assert rss_bytes(proc.pid) < 12 << 30


def test_48_concurrent_requests_equal_each_request_alone(server):
    proc, base, _ = server
    batch = prompts(48)

    async def run():
        async with httpx.AsyncClient(timeout=1800) as client:
            together = await asyncio.gather(*(complete(client, base, p, 8) for p in batch))
            alone = [await complete(client, base, p, 8) for p in batch]
            metrics = (await client.get(base + "/metrics")).text
        return together, alone, metrics

    together, alone, metrics = asyncio.run(run())
    texts = [r["choices"][0]["text"] for r in together]
    assert texts == [r["choices"][0]["text"] for r in alone]
    assert all(r["usage"]["completion_tokens"] == 8 for r in together)
    assert re.search(r"^jaxchat_kv_pages_total \d", metrics, re.M) and re.search(r"^jaxchat_kv_pages_used 0", metrics, re.M)
    assert re.search(r"^jaxchat_compiles_on_request_path_total 0\.0$", metrics, re.M)  # no step waited on one
    assert rss_bytes(proc.pid) < 12 << 30


def test_a_prompt_of_more_than_16k_tokens_is_answered(server):
    _, base, _ = server
    prompt = [(31 * j) % 20000 + 300 for j in range(16500)]

    async def run():
        async with httpx.AsyncClient(timeout=3600) as client:
            return await complete(client, base, prompt, 4)

    reply = asyncio.run(run())
    assert reply["usage"]["prompt_tokens"] == 16500 > 16384
    assert reply["usage"]["completion_tokens"] == 4 and reply["choices"][0]["text"]


def test_the_server_kept_its_own_log_clean(server):
    _, _, log = server
    text = Path(log).read_text()
    assert "Traceback" not in text and "engine step failed" not in text
