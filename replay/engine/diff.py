"""Comparing two recordings of the same program call by call and tag by tag.

Calls are paired by op and ordinal: the k-th call of an op in A with the k-th call of that op in
B, in A's order. Two recordings whose calls interleave differently (a batch of 8 against 8 of
one, recorded Triton launches of two commits, a recording filtered differently) still pair the
same kernel's launches; an op called a different number of times is said, and its extra calls
are not compared.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from replay.compare import Comparison, compare
from replay.engine.evidence import Evidence, gather
from replay.metrics import Metric
from replay.tolerance import Tolerance
from replay.snapshot import CallRecord, Snapshot

# Within a call, what differs first in data flow: inputs and state, then intermediates, then outputs.
ROLE_ORDER = ("in", "state", "tag", "out")


@dataclass
class CallDiff:
    position: int
    index_a: int
    index_b: int
    op: str
    ordinal: int  # this is the op's call number `ordinal` (from 0) in both recordings
    differences: list[dict[str, Any]] = field(default_factory=list)
    evidence: list[Evidence] = field(default_factory=list)  # what a page draws of its differing tensors

    @property
    def knock_on(self) -> bool:
        """Its inputs differ: what it computed differs at least in part because an earlier call's did
        (or differs only in size, as its inputs do)."""
        of_values = self.of_values()
        return not of_values or any(_is_input(d) for d in of_values)

    def of_values(self) -> list[dict[str, Any]]:
        """Its differences of values: all of them, but where its inputs differ only in how many rows
        they hold (a batch of 1 against one of 8), those in the rows both hold and its inputs'
        (`in/`: carried in, so knock-on): its state, scalars and outputs of one shape in both (a
        row count passed as a scalar, a cache the larger batch filled more of; a sum over the
        rows too, which a batch of another size must change) are size."""
        if any(d.get("rows_only") for d in self.differences if _is_input(d)):
            return [d for d in self.differences if not d.get("rows_only") and
                    (d.get("row_counts") or d["tensor"].startswith("in/"))]
        return list(self.differences)

    def to_json(self) -> dict[str, Any]:
        return {"position": self.position, "index_a": self.index_a, "index_b": self.index_b,
                "op": self.op, "ordinal": self.ordinal, "knock_on": self.knock_on, "differences": self.differences}


@dataclass
class DiffReport:
    a: str
    b: str
    calls_compared: int = 0
    structural: list[str] = field(default_factory=list)
    calls: list[CallDiff] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return not self.structural and not self.calls

    def origins(self) -> list[CallDiff]:
        """The first differing call and every later one whose inputs are the same in A and B: where
        a difference starts rather than arrives."""
        return [c for i, c in enumerate(self.calls) if i == 0 or not c.knock_on]

    def first(self) -> dict[str, Any] | None:
        """The first difference of values (CallDiff.of_values); else one of the first call's (of sizes)."""
        if self.calls:
            opening = self.calls[0].differences  # of sizes alone: rows counted say more than a scalar
            first = self.calls[0], next((d for d in opening if d.get("row_counts")), opening[0])
            call, d = next(((call, d) for call in self.calls for d in call.of_values()), first)
            return {"position": call.position, "op": call.op, "ordinal": call.ordinal, "index_a": call.index_a,
                    "index_b": call.index_b, **d}
        return {"structural": self.structural[0]} if self.structural else None

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "identical": self.identical, "calls_compared": self.calls_compared,
                "first_divergence": self.first(), "structural": self.structural,
                "calls": [c.to_json() for c in self.calls]}


def _is_input(difference: dict[str, Any]) -> bool:
    return difference["tensor"] == "args" or difference["tensor"].partition("/")[0] in ("in", "state")


def _difference(key: str, problem: str, comparison: Comparison | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"tensor": key, "problem": problem}
    if comparison is not None:
        out["comparison"] = comparison.to_json()
    return out


def diff_call(a: CallRecord, b: CallRecord, tolerance: Tolerance | None,
              metric: Metric | None = None, drawn: list[Evidence] | None = None) -> list[dict[str, Any]]:
    """Differences between two recordings of one call, in data-flow order. What a Triton launch's
    or an operator's output buffers held before it (its `write_only` arguments: torch.empty's
    leftovers) is no input of it, and is not compared."""
    found = []
    ignored = a.output_buffers
    if a.args != b.args:
        names = [x["name"] for x in a.args if x not in b.args]
        found.append(_difference("args", f"non-tensor arguments differ ({', '.join(names) or 'order'})"))
    for role in ROLE_ORDER:
        ta, tb = a.role(role), b.role(role)
        for name in list(ta) + [n for n in tb if n not in ta]:
            key = f"{role}/{name}"
            if key in ignored:
                continue
            if name not in tb or name not in ta:
                found.append(_difference(key, f"only in {'A' if name in ta else 'B'}"))
                continue
            va, vb = ta[name], tb[name]
            rows = _row_counts(va, vb)
            if rows is not None:  # a batch of 1 against one of 8: the rows both hold are compared
                va, vb = va[:min(rows)], vb[:min(rows)]
            c = compare(vb, va, tolerance, 0 if va.dim() else None)
            if metric is not None and not metric.needs_float64_run:
                c.judged_by(metric)
            if rows is not None:
                found.append(_rows_difference(key, rows, c))
            elif not c.passed:
                found.append(_difference(key, "values differ", c))
            if drawn is not None and not c.passed:
                gathered = gather(a.index, key, "B vs A", vb, va)
                drawn += [gathered] if gathered is not None else []
    return found


def _row_counts(a: torch.Tensor, b: torch.Tensor) -> tuple[int, int] | None:
    """The rows of `a` and `b` where they differ only in how many rows (leading axis) they hold."""
    if a.dim() and a.dim() == b.dim() and a.shape[0] != b.shape[0] and a.shape[1:] == b.shape[1:]:
        return a.shape[0], b.shape[0]
    return None


def _rows_difference(key: str, rows: tuple[int, int], common: Comparison) -> dict[str, Any]:
    """A tensor whose row counts differ: what the rows both hold say. Where they agree it is a
    difference only of size (`rows_only`), which a first divergence passes over for one of values."""
    held = min(rows)
    if common.passed:
        found = _difference(key, f"A has {rows[0]} rows, B {rows[1]}; the {held} both hold agree")
        found["rows_only"] = True
    else:
        found = _difference(key, f"A has {rows[0]} rows, B {rows[1]}; the {held} both hold differ", common)
    found["row_counts"] = list(rows)
    return found


def diff_snapshots(a: str | Path, b: str | Path, tolerance: Tolerance | None = None,
                   metric: Metric | None = None, evidence: bool = False) -> DiffReport:
    """Pair calls by op and ordinal and report every call whose inputs, tags or outputs differ
    (within `tolerance`, or by `metric`)."""
    snap_a, snap_b = Snapshot(a), Snapshot(b)
    report = DiffReport(str(a), str(b))
    if len(snap_a) != len(snap_b):
        report.structural.append(f"A has {len(snap_a)} calls, B has {len(snap_b)}")
    in_b = defaultdict(list)
    for entry in snap_b.entries:
        in_b[entry.op].append(entry)
    counted: Counter[str] = Counter()
    for position, ea in enumerate(snap_a.entries):
        ordinal = counted[ea.op]
        counted[ea.op] += 1
        if ordinal >= len(in_b[ea.op]):
            continue
        eb = in_b[ea.op][ordinal]
        report.calls_compared += 1
        drawn: list[Evidence] | None = [] if evidence else None
        differences = diff_call(snap_a.load(ea), snap_b.load(eb), tolerance, metric, drawn)
        if differences:
            report.calls.append(CallDiff(position, ea.index, eb.index, ea.op, ordinal, differences, drawn or []))
    for op in sorted(set(counted) | set(in_b)):
        if counted[op] != len(in_b[op]):
            report.structural.append(f"op '{op}': {counted[op]} calls in A, {len(in_b[op])} in B")
    return report
