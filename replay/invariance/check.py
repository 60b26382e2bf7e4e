"""Batch invariance: is a row's output the same whatever batch it arrives in?

For an op with a batch axis, a pool of rows (the op's registered example with as many rows as
the largest batch asked for) is the ground truth: each row run alone. Then, bit for bit:
- batch size B: every window of B consecutive pool rows, so that each row is seen at each
  position of a batch of B it can take;
- chunks of C: the pool run as consecutive calls of C rows (a chunked prefill), concatenated;
- padding of P: the pool with P more rows after it (another example's rows: what a padded
  batch carries), its own rows compared.
Ops whose rows share state (`serial_rows`: a KV cache write) are not row-independent and are
left out, said so. On a recording, each call's own arguments are the pool (check_rows), padded
with its own first rows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from replay.compare import compare, row_ranges
from replay.errors import ReplayError
from replay.recorder import returned_values
from replay.registry import Op


@dataclass
class PropertyResult:
    prop: str  # "batch", "chunks", "padding"
    size: int
    calls: int
    rows_changed: list[int] = field(default_factory=list)  # pool rows whose output changed
    max_ulp: int | None = None
    first: str = ""  # the first difference, printed

    @property
    def passed(self) -> bool:
        return not self.rows_changed

    def to_json(self) -> dict[str, Any]:
        return {"property": self.prop, "size": self.size, "calls": self.calls, "passed": self.passed,
                "rows_changed": self.rows_changed, "max_ulp": self.max_ulp, "first": self.first}


@dataclass
class InvarianceReport:
    op: str
    variant: str
    example: str
    rows: int
    results: list[PropertyResult] = field(default_factory=list)
    skipped: str | None = None  # why the op was not checked

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "variant": self.variant, "example": self.example, "rows": self.rows,
                "passed": self.passed, "skipped": self.skipped, "results": [r.to_json() for r in self.results]}


@dataclass(frozen=True)
class Plan:
    batch_sizes: tuple[int, ...] = (1, 2, 3, 8)
    chunks: tuple[int, ...] = (2, 3)
    pads: tuple[int, ...] = (1, 5)


class _Rows:
    """Runs a variant on any selection of pool rows and returns each output's rows."""

    def __init__(self, op: Op, fn: Callable[..., Any], pool: dict[str, Any], extra: dict[str, Any]):
        self.op, self.fn, self.pool, self.extra = op, fn, pool, extra
        self.rows = op.rows(pool) or 0
        self.calls = 0  # since the last reset: a property's count

    def run(self, rows: slice, pad: int = 0) -> dict[str, torch.Tensor]:
        """Outputs of one call on pool rows `rows`, padded after with `pad` rows of `extra`; only the
        pool rows' outputs are returned."""
        args = {}
        for name, value in self.pool.items():
            axis = self.op.batch_axes.get(name)
            if isinstance(value, torch.Tensor) and axis is not None:
                picked = value[(slice(None),) * axis + (rows,)]
                if pad:
                    filler = self.extra[name][(slice(None),) * axis + (slice(0, pad),)]
                    picked = torch.cat([picked, filler], dim=axis)
                args[name] = picked.contiguous()
            else:
                args[name] = value
        self.calls += 1
        outputs = returned_values(self.fn(**args), self.op.outputs)
        count = len(range(*rows.indices(self.rows)))
        return {name: value[(slice(None),) * self._axis(name) + (slice(0, count),)]
                for name, value in outputs.items() if isinstance(value, torch.Tensor) and self._axis(name) is not None}

    def _axis(self, name: str) -> int | None:
        return self.op.batch_axes.get(name)


def check_ops(ops: Iterable[Op], variant: str, example: str | None, plan: Plan, dtype: torch.dtype,
              device: str) -> list[InvarianceReport]:
    """Each op on `example`, or on each of its examples."""
    reports = []
    for op in ops:
        examples = [example] if example else list(op.examples)
        if not examples:
            raise ReplayError(f"op '{op.name}' registers no example (Op.example): its rows cannot be made")
        reports += [check_op(op, variant, name, plan, dtype, device) for name in examples]
    return reports


def check_op(op: Op, variant: str, example: str, plan: Plan, dtype: torch.dtype, device: str) -> InvarianceReport:
    """The batch-invariance properties of `op`'s `variant` on its `example`: a pool as large as the
    largest batch or chunk asked for, padded with another example's rows."""
    if example not in op.examples:
        raise ReplayError(f"op '{op.name}' has no example '{example}' (it has: {', '.join(op.examples) or 'none'})")
    rows = max((*plan.batch_sizes, *plan.chunks, 1))
    make = op.examples[example]
    pool = make(rows, dtype, device) if not op.serial_rows else {}
    extra = make(max((*plan.pads, 1)), dtype, device) if not op.serial_rows else {}
    return check_rows(op, variant, example, pool, extra, plan, device)


def check_rows(op: Op, variant: str, label: str, pool: dict[str, Any], extra: dict[str, Any], plan: Plan,
               device: str) -> InvarianceReport:
    """The properties on the rows of `pool` (a call's arguments), padding with rows of `extra`;
    batch and chunk sizes beyond the pool's rows are left out."""
    if not op.batch_axes:
        raise ReplayError(f"op '{op.name}' declares no batch axis: batch invariance is about rows")
    if op.serial_rows:
        return InvarianceReport(op.name, variant, label, 0, skipped="its rows share state (serial_rows): a row's "
                                                                    "output depends on the rows before it")
    runner = _Rows(op, op.get(variant, device).fn, pool, extra)
    rows = runner.rows
    report = InvarianceReport(op.name, variant, label, rows)
    alone = [runner.run(slice(r, r + 1)) for r in range(rows)]
    expected = {name: torch.cat([a[name] for a in alone], dim=op.batch_axes[name]) for name in alone[0]} if alone \
        else {}
    for size in (s for s in plan.batch_sizes if s <= rows):
        runner.calls = 0
        got = [runner.run(slice(start, start + size)) for start in range(rows - size + 1)]
        report.results.append(_verdict("batch", size, runner.calls, op, expected,
                                       [(start, out) for start, out in enumerate(got)]))
    for size in (s for s in plan.chunks if s <= rows):
        runner.calls = 0
        pieces = [(start, runner.run(slice(start, start + size))) for start in range(0, rows, size)]
        report.results.append(_verdict("chunks", size, runner.calls, op, expected, pieces))
    for pad in plan.pads if rows else ():
        report.results.append(_verdict("padding", pad, 1, op, expected, [(0, runner.run(slice(0, rows), pad=pad))]))
    return report


def _verdict(prop: str, size: int, calls: int, op: Op, expected: dict[str, torch.Tensor],
             pieces: list[tuple[int, dict[str, torch.Tensor]]]) -> PropertyResult:
    """Each piece's outputs (starting at pool row `start`) against the rows alone, bit for bit."""
    result = PropertyResult(prop, size, calls)
    changed: set[int] = set()
    for start, outputs in pieces:
        for name, got in outputs.items():
            axis = op.batch_axes[name]
            want = expected[name].narrow(axis, start, got.shape[axis])
            comparison = compare(got, want, None, axis)
            if comparison.bitwise_equal:
                continue
            changed |= {start + r for r in comparison.bad_rows}
            if comparison.max_ulp is not None:
                result.max_ulp = max(result.max_ulp or 0, comparison.max_ulp)
            if not result.first:
                result.first = f"{name} rows {row_ranges(comparison.bad_rows)} of the call at row {start}: " \
                               f"{comparison.first_difference() or comparison.problem}"
    result.rows_changed = sorted(changed)
    return result
