"""One row of a family's HF tensor-name table (`Entry`) and the layout conversion each row names.

Contract: a family module's `hf_entries(cfg)` lists one `Entry` per HF tensor: its name, the path of
the param it fills, the index on the stacked layer axis, its HF shape and how it converts. A routed
experts param ([E, ...] after the layer axis) is filled either whole by one fused HF tensor (converts
"experts_gate_up", "experts_t") or one expert at a time (`expert`: the index on that axis; `part` is then
relative to the one expert's slice). `convert`
turns an HF array ([out, in] layout) into the param's explicit-heads layout, raising
`ModelLoadError` naming the tensor when the result does not have the param's shape. `listed(rows)`
turns rows of a stacked table into the rows of a listed family (`layers.CausalLM.stacked` False): layer
i's rows fill the params at ("layers", "<i>", ...) instead of index i of a stacked param. A leaf module
besides `config` (the family modules and the loaders import it; it imports neither).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from jaxchat.models.config import ModelLoadError


@dataclass(frozen=True)
class Entry:
    hf: str  # HF tensor name
    path: tuple[str, ...]  # path in the param tree
    layer: int | None  # index on the stacked layer axis, None for a global tensor
    hf_shape: tuple[int, ...]
    convert: str  # "id" | "t" | "in_heads" | "out_heads" | "bias_heads" | "experts_gate_up" | "experts_gate_up_stacked" | "experts_t"
    part: tuple[int, int, int] | None = None  # (axis, start, stop): a slice of a fused param (gate of gate_up)
    expert: int | None = None  # index on the experts axis (the first after the layer axis): one expert's tensor


def convert(x: np.ndarray, e: Entry, target_shape: tuple[int, ...]) -> np.ndarray:
    if e.convert == "id":
        out = x
    elif e.convert == "t":
        out = x.T
    elif e.convert == "in_heads":  # [N*hd, D] -> [D, N, hd] (N may be split in groups: [D, ..., hd])
        hd = target_shape[-1]
        out = x.reshape(-1, hd, x.shape[1]).transpose(2, 0, 1)
    elif e.convert == "out_heads":  # [D, H*hd] -> [H, hd, D]
        h, hd = target_shape[0], target_shape[1]
        out = x.reshape(x.shape[0], h, hd).transpose(1, 2, 0)
    elif e.convert == "bias_heads":
        out = x.reshape(target_shape)
    elif e.convert == "experts_gate_up":  # [E, 2F, D] (gate rows, then up rows) -> [E, D, 2, F]
        out = x.reshape(x.shape[0], 2, -1, x.shape[2]).transpose(0, 3, 1, 2)
    elif e.convert == "experts_gate_up_stacked":  # [E, 2f, d] (gate rows, then up) -> [2E, d, f]: gates, ups
        n, f = x.shape[0], x.shape[1] // 2
        out = x.reshape(n, 2, f, x.shape[2]).transpose(1, 0, 3, 2).reshape(2 * n, x.shape[2], f)
    elif e.convert == "experts_t":  # [E, out, in] -> [E, in, out]
        out = x.transpose(0, 2, 1)
    else:  # pragma: no cover - tables are static
        raise AssertionError(e.convert)
    if e.part is not None and out.size == int(np.prod(target_shape)):
        out = out.reshape(target_shape)  # a slice of a fused param: the same layout with unit/grouped axes
    if tuple(out.shape) != tuple(target_shape):
        raise ModelLoadError(f"tensor {e.hf!r}: converted shape {out.shape} != param shape {target_shape}")
    return out


def listed(rows: list[Entry]) -> list[Entry]:
    """The rows of a stacked table (layer i at index i of ("layers", ...)) for a listed family's per-layer
    params ("layers", "<i>", ...)."""
    return [e if e.layer is None else replace(e, path=("layers", str(e.layer), *e.path[1:]), layer=None)
            for e in rows]
