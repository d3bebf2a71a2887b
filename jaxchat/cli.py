"""The `jaxchat` command: `serve`, `chat`, `convert`, `bench`, `lower`; the one place that wires packages together.

Contract: `jaxchat serve [--model PATH] [--host 127.0.0.1] [--port 8000] [--api-key KEY] ...` loads the
model once (the default model when `--model` is absent; `--data-parallel N`: N replicas over 1/N of the devices
each, `engine.replicas`), logs the detected chat format and serves the OpenAI-compatible API, keeping its
compiled programs in a persistent cache (`--compile-cache DIR`, `--no-compile-cache`; the step programs are
also serialized whole under its `executables/` folder) so the next start of the same model and shapes neither
traces nor compiles them. Its KV cache is a pool of pages
sized by memory (`--kv-cache-gib`, else a default per platform), shared between requests by prefix
(`--no-prefix-cache` turns that off); text the grammar forces is appended without sampling
(`--no-jump-forward` turns that off); an idle server gathers a burst of requests for up to
`--burst-window-ms` (30) before running them together; `jaxchat chat` is a terminal chat against a model or
a server URL;
`jaxchat convert SRC DST` writes an orbax checkpoint.
`jaxchat lower --model CONFIG --chip v5e|v6e|v5p|v7x --devices N ...` plans that TPU slice from the model's
config and lowers every program for it on fake CPU devices (`engine.lowering`); its last line is one JSON
object; exit 0 only when every program lowered and the plan fits. `--platform cuda --chip h100|h200|a100|l4`
does the same for GPUs.
Multi-host: `jaxchat serve --coordinator HOST:PORT --num-processes N --process-id I` (or no such flag on a
TPU pod slice) is run once per process with the same other flags; they join one JAX runtime
(`engine.cluster`), each loads its shards onto one global mesh, process 0 serves HTTP and drives every step
and the others replay them (`engine.step_link`). A lost follower makes process 0 answer the open requests
with 503 and exit with status 1; a lost process 0 makes the followers exit with status 1; SIGTERM to process
0 stops them all (status 0). `--quantize int8` (serve, chat, convert) loads int8
weights (W8A8; convert stores the int8 values and scales). Bad arguments exit with a clear message.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import sys

from jaxchat.engine.config import MAX_BATCH, MAX_CONTEXT
from jaxchat.engine.program_set import PROGRAM_SETS
from jaxchat.models.load import DTYPES, QUANTIZE


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF directory, .gguf file or orbax checkpoint (default: Qwen2.5-Coder-0.5B-Instruct)")
    p.add_argument("--max-batch", type=int, default=MAX_BATCH, help="requests that run at once (slots)")
    p.add_argument("--max-context", type=int, default=MAX_CONTEXT,
                   help="the most tokens one request may hold (prompt + completion); not a reservation")
    p.add_argument("--dtype", choices=DTYPES, default="auto",
                   help="weights and activations; auto: bfloat16 on TPU and GPU, float32 on CPU")
    p.add_argument("--quantize", choices=QUANTIZE, default=None,
                   help="int8: int8 weights with per-channel scales, activations quantised per row (W8A8)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxchat", description="A JAX-native LLM inference engine with an OpenAI-compatible server.")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve_command(sub)
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
    _add_lower_command(sub)
    return parser


def _add_serve_command(sub) -> None:
    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API")
    _add_model_args(serve)
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=os.environ.get("JAXCHAT_API_KEY"), help="require 'Authorization: Bearer KEY' (or set JAXCHAT_API_KEY)")
    serve.add_argument("--no-constrain", action="store_true", help="disable grammar-constrained decoding")
    serve.add_argument("--no-prefix-cache", action="store_true",
                       help="run every prompt whole (default: full KV pages an earlier request left with the same "
                            "tokens from the start are shared, e.g. a system prompt, an agent's previous turn)")
    serve.add_argument("--kv-cache-gib", type=float, default=None, metavar="GIB",
                       help="memory of the KV page pool on each device (default: on TPU/GPU what a device has left after the "
                            "weights, the largest steps' temporaries as XLA reports them and 3%% headroom; on CPU at most "
                            "4 GiB; either way no more than --max-batch requests of --max-context need)")
    serve.add_argument("--page-size", type=int, default=None, metavar="N",
                       help="tokens per KV page (default 16 on CPU and GPU; on TPU the Pallas kernel's guidance for "
                            "--max-context, 128 to 256)")
    serve.add_argument("--max-step-tokens", type=int, default=None, metavar="N",
                       help="the most tokens one step runs over all its requests; longer prompts run in chunks "
                            "(default 512 on CPU, 2048 on TPU/GPU)")
    serve.add_argument("--decode-rows", type=_row_counts, default=None, metavar="N,N,...",
                       help="row counts of the decode programs (steps where every request takes one token), e.g. "
                            "1,8,64: fewer programs to compile at start; a decode step of other rows runs in the next "
                            "count up, or as a ragged step above the largest (default: every power of 2 up to "
                            "--max-batch)")
    serve.add_argument("--no-jump-forward", action="store_true",
                       help="one device step per token (default: text the grammar forces is appended without "
                            "sampling, in one step; either way it is spelled as the tokenizer spells it)")
    serve.add_argument("--attention", choices=("auto", "xla", "pallas"), default="auto",
                       help="attention backend: xla (the jnp ragged path), pallas (JAX's Pallas TPU kernel; off TPU "
                            "under Pallas' interpreter: slow, exact, for checking); auto: pallas on TPU where the "
                            "kernel runs the model, else xla")
    serve.add_argument("--speculative", choices=("auto", "off", "ngram"), default="auto",
                       help="speculative decoding: ngram drafts tokens from the request's own context (prompt "
                            "lookup) and verifies them in one step under the grammar; greedy outputs are unchanged. "
                            "auto: ngram on CPU, off on TPU/GPU (not yet measured there)")
    serve.add_argument("--programs", choices=PROGRAM_SETS, default=None,
                       help="which step programs to compile, and when. background (the default, or what "
                            "JAXCHAT_PROGRAMS says): serve once one ragged program, the largest decode step and their "
                            "sampler are ready, the others compile in the background, steps chunked into the ready "
                            "ones until then; all: compile every program before serving; first: those three only, "
                            "ever (the least compile time and memory; no speculative drafts)")
    serve.add_argument("--no-background-compile", action="store_true",
                       help="the same as --programs all")
    serve.add_argument("--no-overlap", action="store_true",
                       help="take each step's tokens before launching the next (default: the host takes them and "
                            "fills the grammar masks while the next step's forward runs)")
    serve.add_argument("--burst-window-ms", type=float, default=None, metavar="MS",
                       help="an idle server woken by a request waits while more arrive (each within 3 ms of the "
                            "last) and while requests it is still reading have not reached the engine, at most MS "
                            "ms, to run a burst together (default 30; 0: admit at once)")
    serve.add_argument("--data-parallel", type=int, default=None, metavar="N",
                       help="N replicas of the model, each tensor-parallel over 1/N of the devices with its own KV "
                            "pool and --max-batch rows; requests go to the least loaded (default 1; on TPU one per "
                            "chip when the kv heads do not divide the chips and the model fits one chip)")
    serve.add_argument("--log-level", default="info")
    cache = serve.add_mutually_exclusive_group()
    cache.add_argument("--compile-cache", default=None, metavar="DIR",
                       help="persistent XLA compilation cache (default: jax-compilation-cache under the asset cache)")
    cache.add_argument("--no-compile-cache", action="store_true", help="compile every program at start, keep none")
    cluster = serve.add_argument_group("multi-host (one command per process; none of these on a TPU pod slice)")
    cluster.add_argument("--coordinator", default=None, metavar="HOST:PORT",
                         help="process 0's address for jax.distributed (the same on every process)")
    cluster.add_argument("--num-processes", type=int, default=None, help="processes in all")
    cluster.add_argument("--process-id", type=int, default=None, help="this process's index; 0 serves HTTP")


def _add_lower_command(sub) -> None:
    lower = sub.add_parser("lower", help="plan a TPU slice from a model's config and lower every program for it "
                                         "(on fake CPU devices, no TPU, no weights)")
    lower.add_argument("--model", required=True, help="an HF directory or its config.json")
    lower.add_argument("--chip", required=True, choices=("v5e", "v6e", "v5p", "v7x", "h100", "h200", "a100", "l4"),
                       help="a TPU generation, or with --platform cuda a GPU")
    lower.add_argument("--platform", choices=("tpu", "cuda"), default="tpu",
                       help="lower for Cloud TPU (default) or for NVIDIA GPUs (the jnp attention path)")
    lower.add_argument("--devices", type=int, required=True, help="chips of the slice")
    lower.add_argument("--max-batch", type=int, default=MAX_BATCH)
    lower.add_argument("--max-context", type=int, default=MAX_CONTEXT)
    lower.add_argument("--attention", choices=("auto", "xla", "pallas"), default="auto")
    lower.add_argument("--page-size", type=int, default=None, metavar="N",
                       help="tokens per KV page (default: the Pallas kernel's guidance for --max-context, 128-256)")
    lower.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    lower.add_argument("--max-step-tokens", type=int, default=None, metavar="N")
    lower.add_argument("--kv-cache-gib", type=float, default=None, metavar="GIB", help="KV pool per chip")
    lower.add_argument("--speculative", choices=("off", "ngram"), default="off")
    lower.add_argument("--data-parallel", type=int, default=None, metavar="N",
                       help="N replicas over --devices/N chips each (default as serve's on TPU)")
    lower.add_argument("--programs", choices=("all", "largest"), default="all",
                       help="largest: one program of each kind (the most tokens and rows), for a quick check")


def _row_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(sorted({int(part) for part in text.split(",")}))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of row counts, e.g. 1,8,64") from None
    if counts[0] <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: row counts must be positive")
    return counts


def _positive(args: argparse.Namespace, *names: str) -> None:
    for name in names:
        if getattr(args, name, 1) is not None and getattr(args, name, 1) <= 0:
            raise SystemExit(f"jaxchat: error: --{name.replace('_', '-')} must be positive")


def _program_set(args: argparse.Namespace) -> str:
    """--programs, else "all" for --no-background-compile, else the default (JAXCHAT_PROGRAMS or "background")."""
    from jaxchat.api import default_programs

    if args.programs is not None and args.no_background_compile and args.programs != "all":
        raise SystemExit(f"jaxchat: error: --no-background-compile contradicts --programs {args.programs}")
    if args.programs is not None:
        return args.programs
    if args.no_background_compile:
        return "all"
    try:
        return default_programs()
    except ValueError as exc:
        raise SystemExit(f"jaxchat: error: {exc}") from None


def engine_config(args: argparse.Namespace, executable_cache=None):
    """The `EngineConfig` that `jaxchat serve`'s flags ask for (a flag left out keeps the config's default, the
    same as `jaxchat.LLM()`'s); a setting out of range is a CLI error."""
    from jaxchat.engine.config import BURST_GAP_S, EngineConfig

    settings = dict(max_batch=args.max_batch, max_context=args.max_context, dtype=args.dtype, quantize=args.quantize,
                    prefix_cache=not args.no_prefix_cache, jump_forward=not args.no_jump_forward,
                    kv_cache_gib=args.kv_cache_gib, page_size=args.page_size, max_step_tokens=args.max_step_tokens,
                    attention=args.attention, overlap=not args.no_overlap, decode_rows=args.decode_rows,
                    programs=_program_set(args), speculative=args.speculative, executable_cache=executable_cache)
    if args.burst_window_ms is not None:
        settings.update(burst_window_s=args.burst_window_ms / 1000, burst_gap_s=0.0 if args.burst_window_ms == 0
                        else min(BURST_GAP_S, args.burst_window_ms / 1000))
    try:
        return EngineConfig(**settings)
    except ValueError as exc:
        raise SystemExit(f"jaxchat: error: {exc}") from None


def _serve(args: argparse.Namespace) -> int:
    from jaxchat.engine.host_memory import keep_freed_memory, release_freed_memory

    keep_freed_memory()  # before jax starts its threads
    from jaxchat.api import build_chat_service
    from jaxchat.server.run import serve

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from jaxchat.engine.cluster import join_cluster, wants_cluster

    rank = None
    if wants_cluster(args.coordinator, args.num_processes, args.process_id):
        try:
            rank = join_cluster(args.coordinator, args.num_processes, args.process_id)
        except ValueError as exc:
            raise SystemExit(f"jaxchat: error: {exc}") from None
    from jaxchat.engine.compile_cache import disable_compile_cache, enable_compile_cache

    executables = None
    if args.no_compile_cache:
        disable_compile_cache()
    else:
        from jaxchat.api.build import default_executable_cache

        cache = enable_compile_cache(args.compile_cache)
        executables = default_executable_cache(cache)
        logging.getLogger("jaxchat").info("Compilation cache: %s", cache)
    config = engine_config(args, executables)
    if rank is not None and (args.data_parallel or 1) > 1:
        raise SystemExit("jaxchat: error: --data-parallel over several processes is not supported")
    if rank is not None and rank > 0:
        return _follow(args.model, rank, config)
    try:
        service = build_chat_service(args.model, config, constrained=not args.no_constrain, start=rank is None,
                                     data_parallel=args.data_parallel)
    except ValueError as exc:  # a setting the model cannot take (e.g. --attention pallas on a head_dim of 64)
        raise SystemExit(f"jaxchat: error: {exc}") from None
    release_freed_memory()  # the loader's conversion buffers
    # Python's full collections traverse every object; the loaded model's (tokenizer vocabulary, grammar
    # tables, jax objects) took 40-160 ms each here, stalling the event loop and the engine thread alike.
    # Frozen, they are skipped: later collections scan only what serving allocates.
    gc.collect()
    gc.freeze()
    cluster = None if rank is None else _lead(service)
    logging.getLogger("jaxchat").info("Serving %s on http://%s:%d/v1", service.model_id, args.host, args.port)
    try:
        serve(service, host=args.host, port=args.port, api_key=args.api_key, log_level=args.log_level.lower(),
              on_server=None if cluster is None else cluster.attach)
    finally:
        if cluster is not None:
            cluster.finish()  # exits with status 1 when a follower was lost
        service.close()
    if cluster is not None:
        _leave_cluster()
    return 0


class _Leader:
    """Process 0's side of a cluster: a lost follower cuts the open requests (503) and ends the process."""

    EXIT_AFTER_S = 15.0  # a backstop in case the server cannot stop (a handler stuck on the engine)

    def __init__(self) -> None:
        self.server = None
        self.lost: str | None = None
        self.link = None

    def attach(self, server) -> None:
        self.server = server
        if self.lost is not None:
            self.on_lost(self.lost)

    def on_lost(self, reason: str) -> None:
        import threading

        self.lost = reason
        if self.server is None:
            return
        self.server.drain.begin(0.0, f"the cluster lost a process: {reason}; the server is stopping")
        self.server.should_exit = True
        threading.Timer(self.EXIT_AFTER_S, _exit_lost, args=(reason,)).start()

    def finish(self) -> None:
        if self.lost is not None:
            _exit_lost(self.lost)
        self.link.stop()


def _lead(service) -> _Leader:
    import jax

    from jaxchat.engine.step_link import LeaderLink, runner_signature

    leader = _Leader()
    leader.link = LeaderLink.open(jax.process_count() - 1, runner_signature(service.engine.runner), leader.on_lost)
    service.engine.relay_steps(leader.link)
    service.engine.start()
    return leader


def _exit_lost(reason: str) -> None:
    logging.getLogger("jaxchat").error("Stopping: %s", reason)
    logging.shutdown()
    os._exit(1)  # no atexit: jax.distributed's shutdown would wait for the process that is gone


def _follow(model: str | None, rank: int, config) -> int:
    from jaxchat.engine.engine import Engine
    from jaxchat.engine.step_link import FollowerLink, follow, runner_signature

    engine = Engine.from_path(model, config, start=False)
    link = FollowerLink.connect(rank, runner_signature(engine.runner))
    engine.compile_rest(after_adopt=link.report_ready)  # process 0 takes each up once every process has it
    follow(engine.runner, link)
    logging.getLogger("jaxchat").info("Process 0 stopped: process %d stops too", rank)
    _leave_cluster()
    return 0


def _leave_cluster() -> None:
    """jax.distributed's shutdown (a barrier with every process), bounded: a peer gone meanwhile cannot hang us."""
    import threading

    import jax

    done = threading.Thread(target=jax.distributed.shutdown, daemon=True)
    done.start()
    done.join(timeout=30)


def _convert(args: argparse.Namespace) -> int:
    from jaxchat.models import load_model, save_orbax

    save_orbax(load_model(args.src, args.dtype, quantize=args.quantize), args.dst)
    print(f"wrote orbax checkpoint {args.dst}")
    return 0


def _lower(args: argparse.Namespace, argv: list[str]) -> int:
    """`jaxchat lower`: needs `--devices` CPU devices; re-runs itself with XLA_FLAGS when JAX is up with fewer."""
    from jaxchat.engine import lowering

    if not lowering.ensure_devices(args.devices):
        env = {**os.environ, "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={args.devices}"}
        os.execve(sys.executable, [sys.executable, "-m", "jaxchat", *argv], env)
    return lowering.run(args)


def _chat(args: argparse.Namespace) -> int:
    from jaxchat.chat_tui import run_chat

    tools = json.loads(open(args.tools).read()) if args.tools else None
    return run_chat(args, tools)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _positive(args, "max_batch", "max_context", "port", "kv_cache_gib", "page_size", "max_step_tokens", "devices",
              "data_parallel")
    if getattr(args, "decode_rows", None) and args.decode_rows[-1] > args.max_batch:
        raise SystemExit(f"jaxchat: error: --decode-rows {args.decode_rows[-1]} is above --max-batch {args.max_batch}")
    if (getattr(args, "burst_window_ms", None) or 0) < 0:
        raise SystemExit("jaxchat: error: --burst-window-ms must be 0 (off) or positive")
    if args.command == "serve":
        return _serve(args)
    if args.command == "convert":
        return _convert(args)
    if args.command == "chat":
        return _chat(args)
    if args.command == "lower":
        return _lower(args, sys.argv[1:] if argv is None else argv)
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
    print("benchmarks (run with python bench/NAME.py):", *sorted(os.listdir(here)) if os.path.isdir(here) else [], sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
