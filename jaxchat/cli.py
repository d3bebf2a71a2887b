"""The `jaxchat` command: `serve`, `chat`, `convert`, `bench`; the one place that wires packages together.

Contract: `jaxchat serve [--model PATH] [--host 127.0.0.1] [--port 8000] [--api-key KEY] ...` loads the
model once (the default model when `--model` is absent), logs the detected chat format and serves the
OpenAI-compatible API, keeping its compiled programs in a persistent cache (`--compile-cache DIR`,
`--no-compile-cache`; the step programs are also serialized whole under its `executables/` folder) so the
next start of the same model and shapes neither traces nor compiles them, and reusing the K/V of a
prompt's prefix that an idle slot still holds (`--no-prefix-cache` turns that off) and appending text the
grammar forces without sampling it (`--no-jump-forward` turns that off); `jaxchat chat` is a terminal chat against a model or a server URL;
`jaxchat convert SRC DST` writes an orbax checkpoint. `--quantize int8` (serve, chat, convert) loads int8
weights (W8A8; convert stores the int8 values and scales). Bad arguments exit with a clear message.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from jaxchat.models.load import DTYPES, QUANTIZE


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF directory, .gguf file or orbax checkpoint (default: Qwen2.5-Coder-0.5B-Instruct)")
    p.add_argument("--max-batch", type=int, default=8, help="concurrent sequences (slots)")
    p.add_argument("--max-context", type=int, default=4096, help="tokens per sequence (prompt + completion)")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="weights and activations; auto: bfloat16 on TPU and GPU, float32 on CPU")
    p.add_argument("--quantize", choices=QUANTIZE, default=None,
                   help="int8: int8 weights with per-channel scales, activations quantised per row (W8A8)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxchat", description="A JAX-native LLM inference engine with an OpenAI-compatible server.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    _add_model_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=os.environ.get("JAXCHAT_API_KEY"), help="require 'Authorization: Bearer KEY' (or set JAXCHAT_API_KEY)")
    serve.add_argument("--no-constrain", action="store_true", help="disable grammar-constrained decoding")
    serve.add_argument("--no-prefix-cache", action="store_true",
                       help="prefill every prompt whole (default: reuse the K/V an idle slot holds of the prompt's prefix)")
    serve.add_argument("--no-jump-forward", action="store_true",
                       help="sample every token (default: text the grammar forces is appended without sampling)")
    serve.add_argument("--log-level", default="info")
    cache = serve.add_mutually_exclusive_group()
    cache.add_argument("--compile-cache", default=None, metavar="DIR",
                       help="persistent XLA compilation cache (default: jax-compilation-cache under the asset cache)")
    cache.add_argument("--no-compile-cache", action="store_true", help="compile every program at start, keep none")
    chat = sub.add_parser("chat", help="chat in the terminal")
    _add_model_args(chat)
    chat.add_argument("--url", default=None, help="talk to a running server instead of loading a model")
    chat.add_argument("--api-key", default=os.environ.get("JAXCHAT_API_KEY"))
    chat.add_argument("--tools", default=None, help="a JSON file with OpenAI tool definitions")
    convert = sub.add_parser("convert", help="convert a checkpoint (HF directory or .gguf) to an orbax checkpoint")
    convert.add_argument("src")
    convert.add_argument("dst")
    convert.add_argument("--dtype", choices=DTYPES, default="auto")
    convert.add_argument("--quantize", choices=QUANTIZE, default=None, help="store int8 weights and their scales")
    sub.add_parser("bench", help="list the benchmark scripts under bench/")
    return parser


def _positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        if getattr(args, name, 1) is not None and getattr(args, name, 1) <= 0:
            raise SystemExit(f"jaxchat: error: --{name.replace('_', '-')} must be positive")


def _serve(args: argparse.Namespace) -> int:
    from jaxchat.engine.host_memory import keep_freed_memory, release_freed_memory

    keep_freed_memory()  # before jax starts its threads
    from jaxchat.api import build_chat_service
    from jaxchat.server.run import serve

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from jaxchat.engine.compile_cache import disable_compile_cache, enable_compile_cache

    executables = None
    if args.no_compile_cache:
        disable_compile_cache()
    else:
        cache = enable_compile_cache(args.compile_cache)
        executables = cache / "executables"
        logging.getLogger("jaxchat").info("Compilation cache: %s", cache)
    service = build_chat_service(args.model, max_batch=args.max_batch, max_context=args.max_context,
                                 dtype=args.dtype, constrained=not args.no_constrain, quantize=args.quantize,
                                 prefix_cache=not args.no_prefix_cache, executable_cache=executables,
                                 jump_forward=not args.no_jump_forward)
    release_freed_memory()  # the loader's conversion buffers
    logging.getLogger("jaxchat").info("Serving %s on http://%s:%d/v1", service.model_id, args.host, args.port)
    try:
        serve(service, host=args.host, port=args.port, api_key=args.api_key, log_level=args.log_level.lower())
    finally:
        service.close()
    return 0


def _convert(args: argparse.Namespace) -> int:
    from jaxchat.models import load_model, save_orbax

    save_orbax(load_model(args.src, args.dtype, quantize=args.quantize), args.dst)
    print(f"wrote orbax checkpoint {args.dst}")
    return 0


def _chat(args: argparse.Namespace) -> int:
    from jaxchat.chat_tui import run_chat

    tools = json.loads(open(args.tools).read()) if args.tools else None
    return run_chat(args, tools)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _positive(args, "max_batch", "max_context", "port")
    if args.command == "serve":
        return _serve(args)
    if args.command == "convert":
        return _convert(args)
    if args.command == "chat":
        return _chat(args)
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
    print("benchmarks (run with python bench/NAME.py):", *sorted(os.listdir(here)) if os.path.isdir(here) else [], sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
