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
from replay.ranks.recording import is_collective_op
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


def diff_ranks(parent: str | Path, replicated: tuple[str, ...] = (),
               tolerance: Tolerance | None = None) -> RanksDiffReport:
    """Every paired call whose must-agree tensors differ across ranks, in the lowest rank's order.
    `replicated` holds argument names, or OP_GLOB:NAME, that every rank takes whole."""
    ranks = rank_set(parent)
    snapshots = {rank: Snapshot(path, strict=False) for rank, path in ranks.ranks.items()}
    report = RanksDiffReport(str(parent), list(snapshots), structural=list(ranks.problems))
    for op, ordinal, entries in _paired(snapshots, report.structural):
        records = {rank: snapshots[rank].load(entry) for rank, entry in entries.items()}
        if len(records) < 2:  # a collective of a group of one
            continue
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
    """(op, ordinal, each rank's entry) in the lowest rank's order; a collective is paired within its
    group only (the k-th all_reduce of group [0, 1] with the k-th of that group). Ops some rank calls a
    different number of times are said in `structural`, their calls paired as far as every rank has them."""
    by_key = {rank: calls_by_key(snapshot) for rank, snapshot in snapshots.items()}
    for key in sorted({key for keys in by_key.values() for key in keys}):
        counts = {rank: len(keys.get(key, [])) for rank, keys in by_key.items() if _member(key, rank)}
        if len(set(counts.values())) > 1:
            structural.append(f"op '{key}': " + ", ".join(f"{n} calls on rank {r}" for r, n in counts.items()))
    lowest = min(snapshots)
    ordered = sorted((entry.index, key) for key, entries in by_key[lowest].items() for entry in entries)
    seen: Counter[str] = Counter()
    for _, key in ordered:
        ordinal = seen[key]
        seen[key] += 1
        paired = {rank: keys[key][ordinal] for rank, keys in by_key.items() if len(keys.get(key, [])) > ordinal}
        if len(paired) > 1:
            yield paired[lowest].op, ordinal, paired
    # groups the lowest rank is not in (ranks 2 and 3 of a 2x2 layout) are paired by their own lowest
    for key in sorted({key for rank, keys in by_key.items() if rank != lowest for key in keys} - set(by_key[lowest])):
        members = {rank: keys[key] for rank, keys in by_key.items() if key in keys}
        for ordinal in range(min(len(calls) for calls in members.values())):
            yield next(iter(members.values()))[ordinal].op, ordinal, {r: calls[ordinal] for r, calls in members.items()}


def calls_by_key(snapshot: Snapshot) -> dict[str, list[CallEntry]]:
    """A snapshot's calls by op, in order; a collective's by op and group ('torch.distributed.all_reduce@0,1')."""
    calls: dict[str, list[CallEntry]] = {}
    for entry in snapshot.entries:
        key = entry.op
        if is_collective_op(entry.op):
            group = (snapshot.describe(entry).get("collective") or {}).get("group") or []
            key += "@" + ",".join(map(str, group))
        calls.setdefault(key, []).append(entry)
    return calls


def _member(key: str, rank: int) -> bool:
    """Whether `rank` takes part in the calls under `key` (every rank but a collective's non-members)."""
    _, at, group = key.partition("@")
    return not at or not group or str(rank) in group.split(",")


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
    return any(names_argument(given, op, name) for given in replicated)


def names_argument(given: str, op: str, name: str) -> bool:
    """Whether `given` (NAME, or OP_GLOB:NAME, OP_GLOB on the whole op or its last part) names
    argument `name` of a call of `op`."""
    op_glob, _, arg = given.rpartition(":")
    return arg == name and (not op_glob or fnmatch.fnmatchcase(op, op_glob)
                            or fnmatch.fnmatchcase(op.rsplit(".", 1)[-1], op_glob))


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
