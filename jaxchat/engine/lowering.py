"""`jaxchat lower`: plan a TPU slice for a model from its config alone and lower every program the engine would
compile there, for the `tpu` platform, on fake CPU devices (no TPU, no weights).

Contract:
- `ensure_devices(n)`: makes sure this process can have `n` CPU devices (sets `jax_num_cpu_devices` when JAX's
  backends are not yet up and `XLA_FLAGS` does not already ask for enough); False when they are up with fewer
  (the CLI then re-runs itself with `XLA_FLAGS`).
- `abstract_model(path, dtype)`: a `LoadedModel` whose params are `jax.ShapeDtypeStruct`s, from an HF directory's
  `config.json` or a config.json file (no tensors are read).
- `lower_slice(path, chip, devices, ...) -> SliceReport`: the engine's choices for that slice, made as
  `Engine` makes them on TPU (attention path, page size, buckets, step layout), the pool sized per chip
  (`slice_plan.fit_pages`), a `StepRunner` over abstract arrays on a mesh of the first `devices` CPU devices,
  then each program lowered with `lowering_platforms=("tpu",)` and Mosaic kernels targeting the chip
  (`chips.targeting`). `platform="cuda"` plans a GPU (`chips.GPUS`) as `Engine` runs there instead (the jnp
  path, pages of 16 tokens; bytes still counted with TPU tile padding: an upper bound) and lowers for "cuda",
  which jaxlib does on a CPU-only host; `--attention pallas` is refused there (a TPU kernel).
  `programs="largest"` lowers one program of each kind (the most tokens and rows), for quick checks; "all" (the
  default) every one. A slice whose plan does not fit lowers nothing.
  `data_parallel` N (None: `replicas.default_data_parallel` for the chip) plans N replicas of `devices / N`
  chips: the plan (attention path, per-chip bytes, pool) is one replica's, on its own chips, and its programs
  are lowered on the first group's mesh (every replica runs the same programs on its own chips); `kv_pages` is
  one replica's pool.
- `SliceReport.table()`: one line per program (lowered or its error, seconds), then the per-chip bytes, the
  attention path and why, VMEM against the chip's limit; `SliceReport.summary()`: the JSON object (`programs`,
  `lowered`, `per_chip_bytes`, `hbm_bytes`, `vmem_bytes`, `vmem_limit_bytes`, `page_size`, `kv_pages`, ...);
  `SliceReport.ok`: every program lowered and the plan fits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import time
from pathlib import Path
from typing import Any

import jax
from jax.sharding import NamedSharding

from jaxchat.engine import attention_tpu, chips, engine, pool_plan, replicas, slice_plan
from jaxchat.engine.config import MAX_BATCH, MAX_CONTEXT, default_page_size, default_step_tokens
from jaxchat.engine.program_key import ProgramKey
from jaxchat.engine.step import StepRunner, abstract, make_mesh, pow2_buckets


def ensure_devices(n: int) -> bool:
    from jax._src import xla_bridge

    if not xla_bridge.backends_are_initialized():
        jax.config.update("jax_platforms", "cpu")
        flags = re.findall(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
        if not flags or int(flags[-1]) < n:
            jax.config.update("jax_num_cpu_devices", max(n, 1))
    return len(jax.devices()) >= n


def abstract_model(path: str | Path, dtype: str = "bfloat16"):
    from jaxchat.models import LoadedModel
    from jaxchat.models.families import abstract_model as graph_and_state
    from jaxchat.models.families import as_params, from_hf_config

    path = Path(path)
    config_file = path / "config.json" if path.is_dir() else path
    cfg = from_hf_config(json.loads(config_file.read_text()))
    from flax import nnx

    graphdef, state = graph_and_state(cfg, dtype)
    params = as_params(nnx.to_pure_dict(state), cfg)
    return LoadedModel(cfg, graphdef, params, dtype, tokenizer=None, eos_token_ids=(), source=str(path))


@dataclasses.dataclass
class SliceReport:
    chip: chips.Chip
    devices: int
    attention: str
    attention_note: str | None
    page_size: int
    kv_pages: int
    fit: slice_plan.PoolFit
    bytes: dict[str, int]  # per chip: weights, state, kv_pool, temporaries
    vmem_bytes: int
    smem_bytes: int = 0
    data_parallel: int = 1  # replicas, each over devices / data_parallel chips
    data_parallel_note: str | None = None
    rows: list[tuple[str, str, float]] = dataclasses.field(default_factory=list)  # (program, "lowered"|error, s)
    total_programs: int = 0
    platform: str = "tpu"  # what the programs were lowered for ("tpu", "cuda")

    @property
    def lowered(self) -> int:
        return sum(status == "lowered" for _, status, _ in self.rows)

    @property
    def ok(self) -> bool:
        return self.fit.fits and self.rows != [] and self.lowered == len(self.rows)

    def table(self) -> str:
        gib = 1 << 30
        lines = [f"{'program':<24} {'result':<10} seconds"]
        lines += [f"{name:<24} {status if status == 'lowered' else 'ERROR':<10} {s:7.2f}"
                  + ("" if status == "lowered" else f"  {status}") for name, status, s in self.rows]
        if self.data_parallel > 1:
            lines.append(f"{self.data_parallel} data-parallel replicas of {self.devices // self.data_parallel} "
                         f"chip(s), each its own weights and KV pool ({self.data_parallel_note})")
        lines.append(f"chip {self.devices} x {self.chip.name}: per chip "
                     + ", ".join(f"{k} {v / gib:.2f} GiB" for k, v in self.bytes.items())
                     + f" of {self.chip.hbm_bytes / gib:.0f} GiB HBM")
        holder = "replica" if self.data_parallel > 1 else "slice"
        lines.append(f"attention {self.attention}" + (f" ({self.attention_note})" if self.attention_note else "")
                     + f"; KV pool {self.kv_pages} pages of {self.page_size} tokens per {holder}")
        if self.platform != "tpu":
            lines.append(f"lowered for {self.platform}: bytes counted with TPU tile padding (an upper bound there)")
        else:
            lines.append(f"VMEM of the attention blocks {self.vmem_bytes / (1 << 20):.1f} MiB of the "
                         f"{self.chip.vmem_limit_bytes / (1 << 20):.0f} MiB limit passed (chip default "
                         f"{self.chip.default_scoped_vmem_bytes / (1 << 20):.0f} MiB); SMEM of its page tables "
                         f"{self.smem_bytes / 1024:.0f} KiB of {self.chip.smem_bytes >> 10} KiB")
        if not self.fit.fits:
            lines.append(f"DOES NOT FIT: {self.fit.message}")
        return "\n".join(lines)

    def summary(self) -> dict[str, Any]:
        return {"chip": self.chip.name, "platform": self.platform, "devices": self.devices,
                "data_parallel": self.data_parallel, "programs": self.total_programs,
                "lowered": self.lowered, "errors": [n for n, status, _ in self.rows if status != "lowered"],
                "per_chip_bytes": sum(self.bytes.values()), "bytes": self.bytes, "hbm_bytes": self.chip.hbm_bytes,
                "fits": self.fit.fits, "vmem_bytes": self.vmem_bytes,
                "vmem_limit_bytes": self.chip.vmem_limit_bytes, "smem_bytes": self.smem_bytes, "attention": self.attention,
                "page_size": self.page_size, "kv_pages": self.kv_pages,
                "lower_seconds": round(sum(s for _, _, s in self.rows), 2),
                **({"message": self.fit.message} if not self.fit.fits else {})}


def lower_slice(path: str | Path, chip_name: str, devices: int, *, max_batch: int = MAX_BATCH, max_context: int = MAX_CONTEXT,
                attention: str = "auto", page_size: int | None = None, dtype: str = "bfloat16",
                max_step_tokens: int | None = None, kv_cache_gib: float | None = None, speculative: str = "off",
                programs: str = "all", data_parallel: int | None = None,
                platform: str = "tpu") -> SliceReport:
    chip = chips.chip(chip_name, platform)
    runtime = {"tpu": "tpu", "cuda": "gpu"}[platform]  # what `Device.platform` says there: the engine's choices
    if runtime != "tpu" and attention == "pallas":
        raise ValueError(f"--attention pallas on {platform}: the Pallas kernel is a TPU (Mosaic) kernel; the engine "
                         "runs the jnp path there (--attention auto or xla)")
    if len(jax.devices()) < devices:
        raise ValueError(f"--devices {devices}: this process has {len(jax.devices())} devices")
    model = abstract_model(path, dtype)
    cfg = model.config
    slice_devices = devices
    if data_parallel is None:
        data_parallel, dp_why = replicas.default_data_parallel(cfg.num_kv_heads, replicas.weight_bytes(cfg, dtype),
                                                               devices, runtime, chip.hbm_bytes)
    else:
        dp_why = "asked for"
    groups = replicas.split_devices(jax.devices()[:devices], data_parallel)
    devices = len(groups[0])  # from here on, one replica's chips: every replica plans and runs the same programs
    mesh = make_mesh(groups[0])
    specs = model.partition_specs(mesh)
    params = abstract(model.params, jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                                                 is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)))
    page = page_size or default_page_size(runtime, max_context)
    chosen, why = (engine.attention_choice(attention, cfg, runtime, devices, dtype) if runtime == "tpu"
                   else ("xla", None if attention == "xla" else "the Pallas kernel is a TPU kernel"))
    backend = engine.attention_backend(attention, cfg, runtime, page, mesh, chip, dtype)
    step_model = model.step_model(params, runtime, layout="unrolled" if chosen == "pallas" else None)
    step_tokens = min(max_step_tokens or default_step_tokens(runtime), max_batch * max_context)
    stacked = step_model.layout == "stacked"

    def new_pools(n: int):
        return step_model.new_pools(backend, n, page, max_batch)

    per_page, fixed = pool_plan.page_bytes(new_pools, mesh, stacked, backend.pool_head_axis, padded=True)
    weights = slice_plan.chip_bytes(step_model.params)
    vocab = cfg.vocab_size
    state = slice_plan.state_bytes(max_batch, vocab)
    temps = slice_plan.step_temporaries(cfg, step_tokens, max_batch, devices)
    fit = slice_plan.fit_pages(hbm_bytes=chip.hbm_bytes, weights=weights, state=state, temporaries=temps,
                               page_bytes=per_page, fixed=fixed,
                               page_size=page, max_batch=max_batch, max_context=max_context, devices=devices,
                               chip=chip.name, kv_cache_gib=kv_cache_gib)
    pages_per_row = -(-max_context // page)
    smem = slice_plan.kernel_smem(max_batch, pages_per_row)
    if chosen == "pallas" and fit.fits and smem > slice_plan.SMEM_SHARE * chip.smem_bytes:
        fit = dataclasses.replace(fit, fits=False, message=(
            f"the attention kernel's page tables ({max_batch} rows x {pages_per_row} pages) take {smem >> 10} KiB"
            f" of SMEM, over {slice_plan.SMEM_SHARE:.0%} of the chip's {chip.smem_bytes >> 10} KiB: use a larger "
            f"--page-size, a shorter --max-context or fewer rows (--max-batch)"))
    pool_chip = (pool_plan.pool_bytes(new_pools, mesh, fit.pages, stacked, backend.pool_head_axis, padded=True)
                 if fit.pages > 0 else 0)
    report = SliceReport(chip, slice_devices, chosen, why, page, fit.pages, fit,
                         {"weights": weights, "state": state, "kv_pool": pool_chip, "temporaries": temps}, 0,
                         smem_bytes=smem if chosen == "pallas" else 0, data_parallel=data_parallel,
                         data_parallel_note=dp_why, platform=platform)
    if not fit.fits:
        return report
    runner = StepRunner(step_model, max_batch=max_batch, max_context=max_context, vocab_size=vocab,
                        valid_vocab=vocab, mesh=mesh, backend=backend, num_pages=fit.pages,
                        token_buckets=engine.token_buckets(step_tokens), decode_rows=pow2_buckets(1, max_batch),
                        ragged_rows=engine.ragged_rows(max_batch),
                        verify_buckets=engine.verify_buckets(step_tokens, runtime) if speculative == "ngram" else (),
                        abstract_arrays=True)
    keys = runner.program_keys()
    report.total_programs = len(keys)
    if chosen == "pallas":
        report.vmem_bytes = max(kernel_vmem(cfg, dtype, devices, page, chip, k.tokens,
                                            runner.pages_per_row) for k in keys if not k.is_sampler)
    report.rows += lower_programs(runner, keys if programs == "all" else pool_plan.largest_programs(keys), chip,
                                  platform)
    return report


def lower_programs(runner: StepRunner, keys: list[ProgramKey], chip: chips.Chip, platform: str
                   ) -> list[tuple[str, str, float]]:
    """(program, "lowered" or the error, seconds) of lowering each of `keys` for `platform` (TPU: for `chip`)."""
    rows = []
    for key in keys:
        t0 = time.perf_counter()
        try:
            with chips.targeting(chip) if platform == "tpu" else contextlib.nullcontext():
                runner.lower(key, platform)
            status = "lowered"
        except Exception as exc:  # reported per program: the table says which failed and why
            status = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        rows.append((key.name, status, time.perf_counter() - t0))
    return rows


def kernel_vmem(cfg: Any, dtype: str, devices: int, page: int, chip: chips.Chip, tokens: int,
                pages_per_seq: int) -> int:
    """The VMEM of one kernel call of a step of `tokens` tokens, one device's heads, the blocks it would use."""
    heads, kv = cfg.num_heads // devices, cfg.num_kv_heads // devices
    blocks = attention_tpu.block_sizes(dtype, dtype, heads, kv, cfg.head_dim, page, tokens, pages_per_seq, chip,
                                       chip.vmem_limit_bytes)
    return attention_tpu.vmem_bytes(dtype, dtype, heads, kv, cfg.head_dim, page, *blocks)


def run(args: Any, out=print) -> int:
    """The `jaxchat lower` command over parsed `args`: the table, then the JSON line; 0 only when it all fits and
    lowered."""
    try:
        report = lower_slice(args.model, args.chip, args.devices, max_batch=args.max_batch,
                             max_context=args.max_context, attention=args.attention, page_size=args.page_size,
                             dtype=args.dtype, max_step_tokens=args.max_step_tokens, kv_cache_gib=args.kv_cache_gib,
                             speculative=args.speculative, programs=args.programs,
                             data_parallel=args.data_parallel, platform=args.platform)
    except (ValueError, OSError) as exc:
        out(f"jaxchat lower: error: {exc}")
        out(json.dumps({"programs": 0, "lowered": 0, "error": str(exc)}))
        return 2
    out(report.table())
    out(json.dumps(report.summary()))
    return 0 if report.ok else 1
