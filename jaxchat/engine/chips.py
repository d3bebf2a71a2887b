"""Cloud TPU chip generations as the engine plans for them, and lowering for one without the hardware.

Contract:
- `CHIPS`: name ("v5e", "v6e", "v5p", "v7x") -> `Chip` (HBM bytes per chip, VMEM bytes per TensorCore, the
  compiler's default scoped VMEM limit, the `vmem_limit_bytes` the engine passes to its attention kernel, the
  device kind JAX reports, the tuned-table name of JAX's ragged paged attention, the Mosaic chip version and
  TensorCores per JAX device). `chip(name, platform="tpu")` raises ValueError naming the choices.
- `GPUS`: name ("h100", "h200", "a100", "l4") -> a `Chip` with only the memory a GPU has (data sheet, decimal
  GB), for `jaxchat lower --platform cuda`; `chip(name, "cuda")` picks from it.
- `chip_of_device(device)`: the `Chip` of a TPU device (by its device kind), None for any other device.
- `targeting(chip)`: a context manager under which Mosaic (Pallas TPU) kernels lower for `chip` on a host whose
  devices are not TPUs (CPU devices with `lowering_platforms=("tpu",)`): Mosaic reads the chip generation from
  the device kind; here it is said explicitly (`tpu_info.registry`, keyed by the host's device kind), and
  restored on exit. Not thread-safe: lowering for two chips at once in one process is not supported.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import jax

GIB = 1 << 30
MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Chip:
    name: str
    hbm_bytes: int  # per chip
    vmem_bytes: int  # per TensorCore
    default_scoped_vmem_bytes: int  # what a kernel gets without `vmem_limit_bytes`
    vmem_limit_bytes: int  # what the engine asks for its attention kernel
    device_kind: str
    tuned_name: str  # the key of `tuned_block_sizes.TUNED_BLOCK_SIZES`
    mosaic_version: str  # `tpu_info.ChipVersion` member name
    cores_per_device: int
    smem_bytes: int = 1 << 20  # scalar memory per TensorCore (the kernel's page tables live there)


CHIPS: dict[str, Chip] = {
    "v5e": Chip("v5e", 16 * GIB, 128 * MIB, 16 * MIB, 64 * MIB, "TPU v5 lite", "TPU v5", "TPU_V5E", 1),
    "v6e": Chip("v6e", 32 * GIB, 128 * MIB, 32 * MIB, 64 * MIB, "TPU v6 lite", "TPU v6", "TPU_V6E", 1),
    "v5p": Chip("v5p", 95 * GIB, 64 * MIB, 16 * MIB, 32 * MIB, "TPU v5", "TPU v5", "TPU_V5P", 2),
    "v7x": Chip("v7x", 192 * GIB, 64 * MIB, 32 * MIB, 32 * MIB, "TPU7x", "TPU7x", "TPU_7X", 1),
}


GPUS: dict[str, Chip] = {
    name: Chip(name, int(gb * 1e9), 0, 0, 0, kind, "", "", 1, smem_bytes=0) for name, gb, kind in (
        ("h100", 80, "NVIDIA H100 80GB HBM3"), ("h200", 141, "NVIDIA H200"), ("a100", 80, "NVIDIA A100-SXM4-80GB"),
        ("l4", 24, "NVIDIA L4"))}


def chip(name: str, platform: str = "tpu") -> Chip:
    table = CHIPS if platform == "tpu" else GPUS
    if name not in table:
        raise ValueError(f"chip {name!r} on {platform}: choose one of {', '.join(table)}")
    return table[name]


def chip_of_device(device) -> Chip | None:
    kind = getattr(device, "device_kind", "")
    if getattr(device, "platform", "") != "tpu":
        return None
    aliases = {"TPU v5e": "v5e", "TPU v6e": "v6e", "TPU v5p": "v5p", "TPU7x": "v7x"}
    return next((c for c in CHIPS.values() if c.device_kind == kind), None) or CHIPS.get(aliases.get(kind, ""))


@contextlib.contextmanager
def targeting(target: Chip) -> Iterator[None]:
    from jax._src.pallas.mosaic import tpu_info

    host_kind = jax.devices()[0].device_kind
    version = getattr(tpu_info.ChipVersion, target.mosaic_version)
    missing = object()
    before = tpu_info.registry.get(host_kind, missing)
    tpu_info.registry[host_kind] = lambda: tpu_info.get_tpu_info_for_chip(version, target.cores_per_device)
    tpu_info.get_tpu_info.cache_clear()
    try:
        yield
    finally:
        if before is missing:
            tpu_info.registry.pop(host_kind, None)
        else:
            tpu_info.registry[host_kind] = before
        tpu_info.get_tpu_info.cache_clear()
