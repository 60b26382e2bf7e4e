"""`replay diff --ranks`: where tensors that should agree across ranks do not, and which rank differs.

Calls are paired across ranks by op and ordinal, as `replay diff` pairs two recordings. What
must agree: a call's runtime state (position_buf, seq_len_buf, ...: every rank of a tensor-
parallel model walks the same positions), the outputs of an all_reduce, all_gather or broadcast
(every member receives the same), and the arguments named with --replicated (the activations a
tensor-parallel layer takes whole). The rank that differs is the one outside the majority; with
no majority (two ranks), the lowest rank is taken as the reference, and the report says so.
"""
from __future__ import annotations

import fnmatch
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from replay.compare import bitwise_equal, compare
from replay.ranks.layout import rank_set
from replay.snapshot import CallEntry, CallRecord, Snapshot
from replay.tolerance import Tolerance

AGREEING_COLLECTIVES = ("all_reduce", "all_gather", "broadcast")


@dataclass
class Disagreement:
    op: str
    ordinal: int  # the op's call number on every rank
    calls: dict[int, int]  # rank -> call index
    tensor: str  # 'state/position_buf'
    why: str  # why it must agree: "runtime state", "collective output", "--replicated"
    differing: list[int]  # the ranks whose value differs from the reference's
    reference: list[int]  # the ranks holding the reference value
    majority: bool  # the reference is a majority of the ranks (else: the lowest rank)
    comparison: dict[str, Any]  # the first differing rank's value against the reference's

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "ordinal": self.ordinal, "calls": {str(r): i for r, i in self.calls.items()},
                "tensor": self.tensor, "why": self.why, "differing_ranks": self.differing,
                "reference_ranks": self.reference, "majority": self.majority, "comparison": self.comparison}


@dataclass
class RanksDiffReport:
    parent: str
    ranks: list[int]
    calls_compared: int = 0
    structural: list[str] = field(default_factory=list)  # an op called a different number of times by some rank
    disagreements: list[Disagreement] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        return not self.disagreements and not self.structural

    def to_json(self) -> dict[str, Any]:
        first = self.disagreements[0].to_json() if self.disagreements else None
        return {"snapshot": self.parent, "ranks": self.ranks, "agree": self.agree,
                "calls_compared": self.calls_compared, "first_divergence": first, "structural": self.structural,
                "disagreements": [d.to_json() for d in self.disagreements]}


def diff_ranks(parent: str | Path, replicated: tuple[str, ...] = (), tolerance: Tolerance | None = None) -> RanksDiffReport:
    """Every paired call whose must-agree tensors differ across ranks, in the lowest rank's order.
    `replicated` holds argument names, or OP_GLOB:NAME, that every rank takes whole."""
    ranks = rank_set(parent)
    snapshots = {rank: Snapshot(path, strict=False) for rank, path in ranks.ranks.items()}
    report = RanksDiffReport(str(parent), list(snapshots), structural=list(ranks.problems))
    for op, ordinal, entries in _paired(snapshots, report.structural):
        records = {rank: snapshots[rank].load(entry) for rank, entry in entries.items()}
        report.calls_compared += 1
        calls = {rank: entry.index for rank, entry in entries.items()}
        for key, why in _must_agree(op, next(iter(records.values())), replicated):
            values = {rank: record.tensors[key] for rank, record in records.items() if key in record.tensors}
            found = _disagreement(values, tolerance)
            if found is not None:
                differing, reference, majority, comparison = found
                report.disagreements.append(Disagreement(op, ordinal, calls, key, why, differing, reference,
                                                         majority, comparison))
    return report


def _paired(snapshots: dict[int, Snapshot], structural: list[str]) -> Iterator[tuple[str, int, dict[int, CallEntry]]]:
    """(op, ordinal, each rank's entry) in the lowest rank's order; ops some rank calls a different
    number of times are said in `structural`, their calls paired as far as every rank has them."""
    by_op: dict[int, dict[str, list[CallEntry]]] = {}
    for rank, snapshot in snapshots.items():
        by_op[rank] = {}
        for entry in snapshot.entries:
            by_op[rank].setdefault(entry.op, []).append(entry)
    lowest = min(snapshots)
    for op in sorted({op for ops in by_op.values() for op in ops}):
        counts = {rank: len(ops.get(op, [])) for rank, ops in by_op.items()}
        if len(set(counts.values())) > 1:
            structural.append(f"op '{op}': " + ", ".join(f"{n} calls on rank {r}" for r, n in counts.items()))
    seen: Counter[str] = Counter()
    for entry in snapshots[lowest].entries:
        ordinal = seen[entry.op]
        seen[entry.op] += 1
        paired = {rank: ops[entry.op][ordinal] for rank, ops in by_op.items() if len(ops.get(entry.op, [])) > ordinal}
        if len(paired) > 1:
            yield entry.op, ordinal, paired


def _must_agree(op: str, record: CallRecord, replicated: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    kind = (record.collective or {}).get("kind")
    for key in record.tensors:
        role, _, name = key.partition("/")
        if role == "state":
            yield key, "runtime state"
        elif role == "out" and kind in AGREEING_COLLECTIVES:
            yield key, f"{kind} output"
        elif role in ("in", "out") and _named(op, name, replicated):
            yield key, "--replicated"


def _named(op: str, name: str, replicated: tuple[str, ...]) -> bool:
    for given in replicated:
        op_glob, _, arg = given.rpartition(":")
        if arg == name and (not op_glob or fnmatch.fnmatchcase(op, op_glob)
                            or fnmatch.fnmatchcase(op.rsplit(".", 1)[-1], op_glob)):
            return True
    return False


def _disagreement(values: dict[int, torch.Tensor], tolerance: Tolerance | None
                  ) -> tuple[list[int], list[int], bool, dict[str, Any]] | None:
    """(differing ranks, reference ranks, whether the reference is a majority, the comparison of
    the first differing rank against the reference), or None where all agree."""
    classes: list[list[int]] = []  # ranks grouped by equal values, in rank order
    for rank, value in values.items():
        home = next((c for c in classes if _agree(values[c[0]], value, tolerance)), None)
        if home is None:
            classes.append([rank])
        else:
            home.append(rank)
    if len(classes) == 1:
        return None
    largest = max(classes, key=len)
    majority = len(largest) * 2 > len(values)
    reference = largest if majority else classes[0]
    differing = sorted(r for r in values if r not in reference)
    first = differing[0]
    comparison = compare(values[first], values[reference[0]], tolerance, 0 if values[first].dim() else None)
    return differing, reference, majority, comparison.to_json()


def _agree(a: torch.Tensor, b: torch.Tensor, tolerance: Tolerance | None) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bitwise_equal(a, b) if tolerance is None else compare(a, b, tolerance).passed
