"""Parity checks for one op call: batched against single row by row (bitwise), and any variant
against the reference (within the op's tolerance), each failure named by op, output or tag,
rows and first differing element.

Rows follow the op's declaration the way the replay engine does: batched runs on the whole
arguments; single runs once per row on split_row(args, r), or on every batch-axes argument
narrowed to row r; serial_rows ops run those rows in order on the same mutable tensors and
compare the final state. Every variant gets its own clones of the tensor arguments.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from replay.recorder import collecting
from replay.registry import Op, get_op

_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bit_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers, so NaN == NaN and -0.0 != 0.0 compare as stored."""
    if t.dtype.is_floating_point:
        return t.contiguous().view(_INT_OF_WIDTH[t.element_size()])
    return t


@dataclass
class Run:
    """Tensors one variant produced: named outputs (mutated arguments included) and tags."""

    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    tags: dict[str, torch.Tensor] = field(default_factory=dict)

    def named(self) -> dict[str, torch.Tensor]:
        return {**self.outputs, **{f"tag {k}": v for k, v in self.tags.items()}}


def clone_args(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def _output_names(op: Op, count: int) -> tuple[str, ...]:
    if len(op.outputs) == count:
        return op.outputs
    return ("out",) if count == 1 else tuple(f"out{i}" for i in range(count))


def run_variant(op: Op, variant: str, args: dict[str, Any]) -> Run:
    """Call `variant` on `args` as given (mutating them), collecting its outputs and tags."""
    with collecting(level=2) as sink:
        result = op.get(variant)(**args)
    values = () if result is None else result if isinstance(result, (tuple, list)) else (result,)
    outputs = dict(zip(_output_names(op, len(values)), values))
    outputs.update({name: args[name] for name in op.mutates if isinstance(args.get(name), torch.Tensor)})
    return Run(outputs, dict(sink.tags))


def batch_rows(op: Op, args: dict[str, Any]) -> int:
    for name, axis in op.batch_axes.items():
        if isinstance(args.get(name), torch.Tensor):
            return args[name].shape[axis]
    raise ValueError(f"op '{op.name}' declares no batch axis among its arguments")


def row_args(op: Op, args: dict[str, Any], r: int) -> dict[str, Any]:
    if op.split_row is not None:
        return op.split_row(args, r)
    return {k: v.narrow(op.batch_axes[k], r, 1) if isinstance(v, torch.Tensor) and k in op.batch_axes else v
            for k, v in args.items()}


def run_rows(op: Op, variant: str, args: dict[str, Any]) -> Run:
    """`variant` once per row; row outputs and tags joined along their batch axes."""
    rows = batch_rows(op, args)
    shared = clone_args(args) if op.serial_rows else None
    runs = [run_variant(op, variant, row_args(op, shared if shared is not None else clone_args(args), r))
            for r in range(rows)]
    joined = Run()
    for kind in ("outputs", "tags"):
        names = getattr(runs[0], kind).keys()
        for name in names:
            if op.serial_rows and name in op.mutates:
                getattr(joined, kind)[name] = shared[name]  # the state the last row left
            else:
                axis = op.batch_axes.get(name, 0)
                getattr(joined, kind)[name] = torch.cat([getattr(run, kind)[name] for run in runs], axis)
    return joined


@dataclass(frozen=True)
class Divergence:
    name: str
    rows: tuple[int, ...]  # differing rows along the batch axis; empty if the tensor has none
    index: tuple[int, ...] | None  # first differing element; None if shapes or dtypes differ
    a: Any = None
    b: Any = None
    detail: str = ""

    def describe(self, a_name: str, b_name: str, total_rows: int) -> str:
        if self.index is None:
            return f"{self.name}: {self.detail}"
        where = f" at rows {list(self.rows)} of {total_rows}" if self.rows else ""
        at = ", ".join(map(str, self.index))
        return (f"{self.name}{where}; first at {self.name.split()[-1]}[{at}]: "
                f"{a_name}={self.a!r} {b_name}={self.b!r}")


@dataclass
class ParityReport:
    op: str
    a: str
    b: str
    rows: int
    divergences: list[Divergence]

    @property
    def ok(self) -> bool:
        return not self.divergences

    @property
    def message(self) -> str:
        if self.ok:
            return f"op '{self.op}': {self.a} and {self.b} agree bitwise on {self.rows} row(s)"
        parts = "; ".join(d.describe(self.a, self.b, self.rows) for d in self.divergences)
        return f"op '{self.op}': {self.a} differs from {self.b} row by row: {parts}"


def _compare_bitwise(name: str, a: torch.Tensor, b: torch.Tensor, axis: int | None) -> Divergence | None:
    if a.shape != b.shape or a.dtype != b.dtype:
        return Divergence(name, (), None, detail=f"shape/dtype {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")
    diff = (bit_view(a) != bit_view(b)).cpu()
    if not diff.any():
        return None
    first = tuple(torch.nonzero(diff)[0].tolist())
    rows = ()
    if axis is not None and a.dim() > 0:
        per_row = diff.movedim(axis, 0)
        rows = tuple(torch.nonzero(per_row.reshape(per_row.shape[0], -1).any(1)).flatten().tolist())
    return Divergence(name, rows, first, a[first].item(), b[first].item())


def row_parity(op: Op | str, args: dict[str, Any], *, a: str = "batched", b: str = "single") -> ParityReport:
    """Variant `a` on all rows against variant `b` row by row, compared bit for bit."""
    op = get_op(op) if isinstance(op, str) else op
    whole = run_variant(op, a, clone_args(args))
    by_row = run_rows(op, b, args)
    divergences = []
    theirs = by_row.named()
    for name, value in whole.named().items():
        if name not in theirs:
            divergences.append(Divergence(name, (), None, detail=f"produced by {a} only"))
            continue
        key = name.split()[-1]
        axis = None if (op.serial_rows and key in op.mutates) else op.batch_axes.get(key)
        found = _compare_bitwise(name, value, theirs[name], axis)
        if found is not None:
            divergences.append(found)
    divergences.sort(key=lambda d: not d.rows)  # those that name rows first
    return ParityReport(op.name, a, b, batch_rows(op, args), divergences)


def reference_violations(op: Op | str, args: dict[str, Any], variant: str) -> list[str]:
    """Outputs and tags of `variant` outside the op's tolerance of the reference's, one line each."""
    op = get_op(op) if isinstance(op, str) else op
    ref = run_variant(op, "reference", clone_args(args)).named()
    got = run_variant(op, variant, clone_args(args)).named()
    problems = []
    for name, expected in ref.items():
        actual = got.get(name)
        if actual is None or actual.shape != expected.shape or actual.dtype != expected.dtype:
            problems.append(f"op '{op.name}' {variant}: {name} missing or of another shape/dtype than the reference's")
            continue
        tol = op.tolerance_for(expected.dtype)
        exp64, act64 = expected.double(), actual.double()
        bad = ((act64 - exp64).abs() > tol.atol + tol.rtol * exp64.abs()) | (act64.isnan() != exp64.isnan())
        if bad.any():
            first = tuple(torch.nonzero(bad.cpu())[0].tolist())
            worst = (act64 - exp64).abs().nan_to_num(float("inf")).max().item()
            problems.append(f"op '{op.name}' {variant}: {name} outside atol={tol.atol} rtol={tol.rtol} of the "
                            f"reference at {int(bad.sum())} element(s), max |diff| {worst:.3g}; first at "
                            f"{list(first)}: {variant}={actual[first].item()!r} reference={expected[first].item()!r}")
    return problems
