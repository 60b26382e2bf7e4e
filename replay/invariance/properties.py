"""Batch invariance: is a row's output the same whatever batch it arrives in?

For an op with a batch axis, a pool of rows (the op's registered example with as many rows as
the largest batch asked for) is the ground truth: each row run alone. Then, bit for bit:
- batch size B: every window of B consecutive pool rows, so that each row is seen at each
  position of a batch of B it can take;
- chunks of C: the pool run as consecutive calls of C rows (a chunked prefill), concatenated;
- padding of P: the pool with P more rows after it (another example's rows: what a padded
  batch carries), its own rows compared.
Rows are cut from the pool the way the `single` variant's replay cuts them (the op's `split_row`,
else each batch-axis argument narrowed), and a batch is those rows' arguments joined again: what
a row's cut gave it (its x, its entry of position_buf or kv_cache_lengths) concatenated, what
every row shares (a weight) passed as it is. Ops whose rows share state (`serial_rows`: a KV cache
write), or that declare no batch axis, are not row-independent and are left out, said so. On a
recording, each call's own arguments are the pool (check_rows), padded with its own first rows.

With `backward`, each call also back-propagates a fixed upstream gradient (one random row per pool
row, zeros for padding rows) and the gradients join the comparison: a batch-axis input's gradient
row by row like an output; a gradient that reduces over the rows (a weight's) only under padding,
against the unpadded call, since zero upstream rows must add nothing to it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from replay.compare import compare, row_ranges
from replay.errors import ReplayError
from replay.context import returned_values
from replay.registry import Op


@dataclass
class PropertyResult:
    prop: str  # "batch", "chunks", "padding"
    size: int
    calls: int
    rows_changed: list[int] = field(default_factory=list)  # pool rows whose output changed
    whole_changed: list[str] = field(default_factory=list)  # gradients reduced over the rows that changed
    max_ulp: int | None = None
    first: str = ""  # the first difference, printed

    @property
    def passed(self) -> bool:
        return not self.rows_changed and not self.whole_changed

    def to_json(self) -> dict[str, Any]:
        return {"property": self.prop, "size": self.size, "calls": self.calls, "passed": self.passed,
                "rows_changed": self.rows_changed, "whole_changed": self.whole_changed, "max_ulp": self.max_ulp,
                "first": self.first}


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
    backward: bool = False


def _take(value: torch.Tensor, axis: int, rows: slice) -> torch.Tensor:
    return value[(slice(None),) * axis + (rows,)]


class NotRowwise(Exception):
    """A row's cut of an argument cannot be joined with other rows' (a per-row number, a scalar)."""


def _join_rows(op: Op, pool: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One call's arguments from single-row ones (Op.row_arguments): what is the pool's own value in
    every row is shared and passed as it is; tensors cut per row are concatenated along their batch
    axis (the first where the op declares none); equal other values are passed once."""
    joined = {}
    for name, first in rows[0].items():
        values = [row[name] for row in rows]
        if all(value is pool.get(name) for value in values):
            joined[name] = first
        elif all(isinstance(value, torch.Tensor) for value in values):
            try:
                joined[name] = torch.cat(values, dim=op.batch_axes.get(name, 0)).contiguous()
            except (RuntimeError, IndexError) as exc:
                raise NotRowwise(f"'{name}' as cut per row cannot be joined: {' '.join(str(exc).split())}") from None
        elif all(value == first for value in values):
            joined[name] = first
        else:
            raise NotRowwise(f"'{name}' takes a different value in each row, which no batched call can pass")
    return joined


class _Rows:
    """Runs a variant on any selection of pool rows and returns the pool rows' outputs (and, with
    `backward`, their gradients) keyed by name, with each name's batch axis in `axes`."""

    def __init__(self, op: Op, variant: str, fn: Callable[..., Any], pool: dict[str, Any], extra: dict[str, Any],
                 backward: bool):
        self.op, self.variant, self.fn, self.pool, self.backward = op, variant, fn, pool, backward
        self.rows = op.rows(pool) or 0
        self._pool_rows = [op.row_arguments(pool, r) for r in range(self.rows)]
        # padding rows carry their own cut of the other example; what every row shares is the pool's
        self._pad_rows = [{name: pool[name] if value is extra.get(name) and name in pool else value
                           for name, value in op.row_arguments(extra, r).items()}
                          for r in range(op.rows(extra) or 0)]
        self.calls = 0  # since the last reset: a property's count
        self.axes = dict(op.batch_axes)
        self.whole_grads: dict[str, torch.Tensor] = {}  # of the last call: gradients of inputs without a batch axis
        self._upstream: dict[str, torch.Tensor] = {}  # per output, one row per pool row

    def run(self, rows: slice, pad: int = 0) -> dict[str, torch.Tensor]:
        """One call on pool rows `rows`, padded after with `pad` rows of `extra`; only the pool rows'
        values are returned."""
        args = _join_rows(self.op, self.pool, self._pool_rows[rows] + self._pad_rows[:pad])
        if self.backward:
            args = {name: value.detach().clone().requires_grad_() if _differentiable(value) else value
                    for name, value in args.items()}
        self.calls += 1
        with torch.enable_grad():
            outputs = {name: value for name, value in returned_values(self.fn(**args), self.op.outputs).items()
                       if isinstance(value, torch.Tensor) and name in self.axes}
        count = len(range(*rows.indices(self.rows)))
        if self.backward:
            outputs.update(self._gradients(args, outputs, rows, count, pad))
        return {name: _take(value, self.axes[name], slice(0, count)) for name, value in outputs.items()}

    def _gradients(self, args: dict[str, Any], outputs: dict[str, torch.Tensor], rows: slice, count: int,
                   pad: int) -> dict[str, torch.Tensor]:
        """Back-propagates the pool rows' upstream rows (zeros for padding): gradients of batch-axis
        inputs are returned as rows named 'grad <input>'; the others are kept in `whole_grads`."""
        inputs = {name: value for name, value in args.items() if isinstance(value, torch.Tensor) and value.requires_grad}
        if not any(value.grad_fn is not None for value in outputs.values()):
            raise ReplayError(f"op '{self.op.name}' variant '{self.variant}' is not differentiable: "
                              f"its outputs carry no gradient (--backward)")
        upstream = []
        for name, value in outputs.items():
            axis = self.axes[name]
            pool_rows = _take(self._upstream_rows(name, value), axis, rows)
            padding = torch.zeros_like(_take(value, axis, slice(count, None)))
            upstream.append(torch.cat([pool_rows, padding], dim=axis) if pad else pool_rows)
        grads = torch.autograd.grad(list(outputs.values()), list(inputs.values()), upstream, allow_unused=True)
        row_grads, self.whole_grads = {}, {}
        for (name, value), grad in zip(inputs.items(), grads):
            if grad is None:
                continue
            batch_axis = self.op.batch_axes.get(name)
            if batch_axis is None:
                self.whole_grads[f"grad {name}"] = grad
            else:
                self.axes[f"grad {name}"] = batch_axis
                row_grads[f"grad {name}"] = grad
        return row_grads

    def _upstream_rows(self, name: str, value: torch.Tensor) -> torch.Tensor:
        """The upstream gradient of output `name` for every pool row, made once from a fixed seed."""
        if name not in self._upstream:
            axis = self.axes[name]
            shape = list(value.shape)
            shape[axis] = self.rows
            gen = torch.Generator().manual_seed(len(self._upstream))
            self._upstream[name] = torch.randn(shape, generator=gen).to(value.device, value.dtype)
        return self._upstream[name]


def _differentiable(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype.is_floating_point


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
    try:
        pool = make(rows, dtype, device) if not op.serial_rows else {}
        extra = make(max((*plan.pads, 1)), dtype, device) if not op.serial_rows else {}
        return check_rows(op, variant, example, pool, extra, plan, device)
    except ReplayError:
        raise
    except Exception as exc:  # the code under test failing on its own example: said of it, in one line
        raise ReplayError(f"op '{op.name}' {variant}, example '{example}' on {device}: {type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:300]}") from None


def check_rows(op: Op, variant: str, label: str, pool: dict[str, Any], extra: dict[str, Any], plan: Plan,
               device: str) -> InvarianceReport:
    """The properties on the rows of `pool` (a call's arguments), padding with rows of `extra`;
    batch and chunk sizes beyond the pool's rows are left out."""
    if not op.batch_axes:
        return InvarianceReport(op.name, variant, label, 0, skipped="it declares no batch axis: batch invariance is "
                                                                    "about rows")
    if op.serial_rows:
        return InvarianceReport(op.name, variant, label, 0, skipped="its rows share state (serial_rows): a row's "
                                                                    "output depends on the rows before it")
    runner = _Rows(op, variant, op.get(variant, device).fn, pool, extra, plan.backward)
    try:
        return _check(op, variant, label, runner, plan)
    except NotRowwise as exc:
        return InvarianceReport(op.name, variant, label, runner.rows, skipped=f"its rows cannot be batched again: {exc}")


def _check(op: Op, variant: str, label: str, runner: _Rows, plan: Plan) -> InvarianceReport:
    rows = runner.rows
    report = InvarianceReport(op.name, variant, label, rows)
    alone = [runner.run(slice(r, r + 1)) for r in range(rows)]
    expected = {name: torch.cat([a[name] for a in alone], dim=runner.axes[name]) for name in alone[0]} if alone \
        else {}
    for size in (s for s in plan.batch_sizes if s <= rows):
        runner.calls = 0
        got = [runner.run(slice(start, start + size)) for start in range(rows - size + 1)]
        report.results.append(_verdict("batch", size, runner.calls, runner.axes, expected,
                                       [(start, out) for start, out in enumerate(got)]))
    for size in (s for s in plan.chunks if s <= rows):
        runner.calls = 0
        pieces = [(start, runner.run(slice(start, start + size))) for start in range(0, rows, size)]
        report.results.append(_verdict("chunks", size, runner.calls, runner.axes, expected, pieces))
    unpadded = {}
    if plan.backward and rows and plan.pads:
        runner.run(slice(0, rows))
        unpadded = runner.whole_grads
    for pad in plan.pads if rows else ():
        result = _verdict("padding", pad, 1, runner.axes, expected, [(0, runner.run(slice(0, rows), pad=pad))])
        _compare_whole(result, runner.whole_grads, unpadded)
        report.results.append(result)
    return report


def _verdict(prop: str, size: int, calls: int, axes: dict[str, int], expected: dict[str, torch.Tensor],
             pieces: list[tuple[int, dict[str, torch.Tensor]]]) -> PropertyResult:
    """Each piece's values (starting at pool row `start`) against the rows alone, bit for bit."""
    result = PropertyResult(prop, size, calls)
    changed: set[int] = set()
    for start, outputs in pieces:
        for name, got in outputs.items():
            axis = axes[name]
            want = expected[name].narrow(axis, start, got.shape[axis])
            comparison = compare(got, want, None, axis)
            if comparison.bitwise_equal:
                continue
            changed |= {start + r for r in comparison.bad_rows}
            _note(result, comparison, f"{name} rows {row_ranges(comparison.bad_rows)} of the call at row {start}")
    result.rows_changed = sorted(changed)
    return result


def _compare_whole(result: PropertyResult, got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Gradients that reduce over the rows, padded against unpadded, bit for bit."""
    for name, value in got.items():
        comparison = compare(value, want[name], None)
        if not comparison.bitwise_equal:
            result.whole_changed.append(name)
            _note(result, comparison, f"{name} (reduced over the rows)")


def _note(result: PropertyResult, comparison: Any, where: str) -> None:
    if comparison.max_ulp is not None:
        result.max_ulp = max(result.max_ulp or 0, comparison.max_ulp)
    if not result.first:
        result.first = f"{where}: {comparison.first_difference() or comparison.problem}"
