"""Bytes a compiled XLA program touches, read off its optimized HLO, for benchmarks.

XLA's `cost_analysis()["bytes accessed"]` charges every instruction with all of its operands and its result.
For a gather, a scatter or a dynamic slice that is the whole array indexed (a KV pool of every page, an
embedding table), not the part touched. `hlo_bytes(compiled)` walks the program's optimized HLO the same way
and returns two totals:
- `plain`: every instruction charged with all of its operands and its result, as XLA's cost analysis does
  (it checks the walk against XLA's own figure);
- `touched`: the same, except that the array a gather or dynamic-slice indexes is charged with what it
  returns, and the array a scatter or dynamic-update-slice writes into with what it writes (read and written),
  inside fusions too (a fusion parameter used only that way; its result, when it is the written array).
Computations run by control flow are charged once each, as XLA does (a while body once; unroll loops whose
iterations matter); a conditional is charged with its cheapest branch (`touched`) or its first (`plain`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8}
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16)\[([\d,]*)\]")
_FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "partition-id",
         "replica-id", "iota"}
_INDEXED_READ = {"gather", "dynamic-slice"}
_INDEXED_WRITE = {"scatter", "dynamic-update-slice"}


def shape_bytes(shape: str) -> int:
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _BYTES[dtype]
    return total


@dataclass
class Instr:
    name: str
    shape: str
    op: str
    operands: list[str]
    attrs: str


@dataclass
class Computation:
    name: str
    instrs: list[Instr] = field(default_factory=list)
    params: dict[int, str] = field(default_factory=dict)  # parameter index -> instruction name


def _balanced(text: str, start: int) -> int:
    """Index just past the bracket group opening at text[start]."""
    depth, i = 0, start
    pairs = {"(": ")", "[": "]", "{": "}"}
    closing = pairs[text[start]]
    while i < len(text):
        if text[i] == text[start]:
            depth += 1
        elif text[i] == closing:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return len(text)


def parse(text: str) -> tuple[dict[str, Computation], str]:
    comps: dict[str, Computation] = {}
    entry = ""
    current: Computation | None = None
    for raw in text.splitlines():
        line = raw.strip()
        head = re.match(r"^(ENTRY )?(%[^\s(]+)\s.*\{$", line)
        if head and " = " not in line.split("{")[0]:
            current = Computation(head.group(2))
            comps[current.name] = current
            if head.group(1):
                entry = current.name
            continue
        if line == "}" or current is None or " = " not in line:
            continue
        body = line[5:] if line.startswith("ROOT ") else line
        name, rest = body.split(" = ", 1)
        if rest.startswith("("):
            end = _balanced(rest, 0)
        else:
            end = rest.index(" ")
        shape, rest = rest[:end], rest[end:].lstrip()
        op = rest[:rest.index("(")]
        close = _balanced(rest, len(op))
        operands = re.findall(r"%[^\s,()]+", rest[len(op):close])
        instr = Instr(name, shape, op, operands, rest[close:])
        current.instrs.append(instr)
        if op == "parameter":
            current.params[int(rest[len(op) + 1:close - 1])] = name
    return comps, entry


def _called(attrs: str, key: str) -> list[str]:
    m = re.search(key + r"=\{?([^},]+(?:,\s*%[^},]+)*)\}?", attrs)
    return re.findall(r"%[^\s,}]+", m.group(1)) if m else []


class _Walker:
    def __init__(self, comps: dict[str, Computation], touched: bool) -> None:
        self.comps, self.touched = comps, touched
        self.sizes = {i.name: shape_bytes(i.shape) for c in comps.values() for i in c.instrs}

    def computation(self, name: str) -> int:
        return sum(self.instr(i) for i in self.comps[name].instrs)

    def instr(self, i: Instr) -> int:
        if i.op in _FREE:
            return 0
        if i.op == "while":
            return sum(self.computation(c) for c in _called(i.attrs, "body") + _called(i.attrs, "condition"))
        if i.op == "conditional":
            branches = [self.computation(c) for c in _called(i.attrs, "branch_computations")]
            if not branches:
                branches = [self.computation(c) for c in _called(i.attrs, "true_computation")
                            + _called(i.attrs, "false_computation")]
            return (min(branches) if self.touched else branches[0]) if branches else 0
        if i.op == "call":
            return sum(self.computation(c) for c in _called(i.attrs, "to_apply"))
        operands = [self.sizes.get(o, 0) for o in i.operands]
        out = shape_bytes(i.shape)
        if i.op == "fusion" and self.touched:
            return self.fusion(i, operands, out)
        if self.touched and i.op in _INDEXED_READ:
            return out + sum(operands[1:]) + out
        if self.touched and i.op in _INDEXED_WRITE:
            update = operands[2] if i.op == "scatter" else operands[1]
            index = operands[1] if i.op == "scatter" else sum(operands[2:])
            return 2 * update + index
        return sum(operands) + out

    def fusion(self, i: Instr, operands: list[int], out: int) -> int:
        inner = self.comps[_called(i.attrs, "calls")[0]]
        uses: dict[str, list[tuple[Instr, int]]] = {}
        aliases = {p: p for p in inner.params.values()}
        for j in inner.instrs:
            for pos, o in enumerate(j.operands):
                root = aliases.get(o)
                if root is not None:
                    if j.op == "bitcast":
                        aliases[j.name] = root
                    else:
                        uses.setdefault(root, []).append((j, pos))
        total = 0
        for index, pname in inner.params.items():
            full = operands[index] if index < len(operands) else 0
            spots = uses.get(pname, [])
            if spots and all(pos == 0 and j.op in _INDEXED_READ for j, pos in spots):
                total += sum(shape_bytes(j.shape) for j, _ in spots)
            elif spots and all(pos == 0 and j.op in _INDEXED_WRITE for j, pos in spots):
                written = sum(self.sizes.get(j.operands[2 if j.op == "scatter" else 1], 0) for j, _ in spots)
                total += written
                if out >= full:  # the result is (or holds) the written array: charge what was written
                    out += written - full
            else:
                total += full
        return total + out


def hlo_bytes(compiled) -> dict[str, float]:
    """{"plain": ..., "touched": ..., "xla": XLA's own "bytes accessed"} for a `jax.stages.Compiled`."""
    comps, entry = parse(compiled.as_text())
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return {"plain": float(_Walker(comps, False).computation(entry)),
            "touched": float(_Walker(comps, True).computation(entry)), "xla": float(cost["bytes accessed"])}
