"""`replay diff` of a multi-rank recording against another recording: put back together, call by call,
and compared with a recording of the same model on one rank (`replay diff SHARDED UNSHARDED`), or
rank by rank with another multi-rank recording.

Calls pair by op and ordinal (the collectives, which the unsharded run does not make, are left
out). Each tensor of a rank's call is put back together by its placement: `shard:D` (the ranks'
pieces concatenated along dimension D, in rank order), `partial` (summed: a row-parallel
layer's output before its all_reduce) or `replicate` (every rank holds it whole: the lowest
rank's). Placements are given per argument name (`--shard NAME=PLACEMENT`, or
`OP_GLOB:NAME=PLACEMENT`); a tensor given none is taken as replicated where every rank holds the
same bits, and as sharded along the one dimension where the ranks' shapes add up to the
unsharded shape; any other is not compared, and the report says so.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any
import torch

from replay.compare import bitwise_equal
from replay.engine.diff import CallDiff, DiffReport, diff_call, diff_snapshots
from replay.errors import ReplayError
from replay.metrics import Metric
from replay.ranks.agreement import names_argument
from replay.ranks.layout import rank_set
from replay.ranks.recording import is_collective_op
from replay.snapshot import CallRecord, Snapshot
from replay.tolerance import Tolerance

PLACEMENT = re.compile(r"^(shard:-?\d+|partial|replicate)$")


def parse_placements(given: tuple[str, ...]) -> dict[str, str]:
    """`--shard` values as {'OP_GLOB:NAME' or 'NAME': placement}; a malformed one raises ReplayError
    (bad input) naming it."""
    placements = {}
    for item in given:
        name, _, placement = item.partition("=")
        if not name or not PLACEMENT.match(placement):
            raise ReplayError(f"--shard {item!r}: give NAME=shard:DIM, NAME=partial or NAME=replicate "
                              "(NAME an argument, or OP_GLOB:NAME)")
        placements[name] = placement
    return placements


def diff_sharded(sharded: str | Path, unsharded: str | Path, placements: dict[str, str],
                 tolerance: Tolerance | None = None, metric: Metric | None = None) -> DiffReport:
    """The sharded recording's calls, put back together, against the unsharded recording's."""
    ranks = rank_set(sharded)
    snapshots = {rank: Snapshot(path, strict=False) for rank, path in ranks.ranks.items()}
    whole = Snapshot(unsharded)
    report = DiffReport(str(sharded), str(unsharded), structural=list(ranks.problems))
    by_op = _by_op(whole)
    per_rank = {rank: _by_op(snapshot) for rank, snapshot in snapshots.items()}
    lowest = min(snapshots)
    seen: Counter[str] = Counter()
    for position, entry in enumerate(e for e in snapshots[lowest].entries if not is_collective_op(e.op)):
        ordinal = seen[entry.op]
        seen[entry.op] += 1
        if ordinal >= len(by_op.get(entry.op, [])) or any(len(calls.get(entry.op, [])) <= ordinal
                                                   for calls in per_rank.values()):
            continue
        records = {rank: snapshots[rank].load(calls[entry.op][ordinal]) for rank, calls in per_rank.items()}
        expected = whole.load(by_op[entry.op][ordinal])
        merged, unplaced = _merged(entry.op, records, expected, placements)
        report.calls_compared += 1
        compared = dataclasses.replace(expected, tensors={k: v for k, v in expected.tensors.items()
                                                          if k not in unplaced})
        differences = diff_call(merged, compared, tolerance, metric)
        differences += [{"tensor": key, "problem": f"not compared: {why}"} for key, why in unplaced.items()]
        if differences:
            report.calls.append(CallDiff(position, entry.index, expected.index, entry.op, ordinal, differences))
    for op in sorted(set(seen) | set(by_op)):
        if seen[op] != len(by_op.get(op, [])):
            report.structural.append(f"op '{op}': {seen[op]} calls sharded, {len(by_op.get(op, []))} unsharded")
    return report


@dataclass
class RankByRankDiff:
    """Two multi-rank recordings compared rank with rank (two commits of one tensor-parallel program)."""

    a: str
    b: str
    structural: list[str]  # a rank only one side recorded
    ranks: dict[int, DiffReport]

    @property
    def identical(self) -> bool:
        return not self.structural and all(report.identical for report in self.ranks.values())

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "identical": self.identical, "structural": self.structural,
                "ranks": {str(rank): report.to_json() for rank, report in self.ranks.items()}}


def diff_rank_by_rank(a: str | Path, b: str | Path, tolerance: Tolerance | None = None,
                      metric: Metric | None = None) -> RankByRankDiff:
    """Each rank of A against the same rank of B, as `replay diff` compares two snapshots."""
    ranks_a, ranks_b = rank_set(a), rank_set(b)
    structural = [f"rank {rank} is only in {side}" for side, mine, theirs in (("A", ranks_a, ranks_b),
                                                                              ("B", ranks_b, ranks_a))
                  for rank in mine.ranks if rank not in theirs.ranks]
    return RankByRankDiff(str(a), str(b), structural,
                          {rank: diff_snapshots(path, ranks_b.ranks[rank], tolerance, metric)
                           for rank, path in ranks_a.ranks.items() if rank in ranks_b.ranks})


def _by_op(snapshot: Snapshot) -> dict[str, list[int]]:
    calls: dict[str, list[int]] = defaultdict(list)
    for entry in snapshot.entries:
        calls[entry.op].append(entry.index)
    return calls


def _merged(op: str, records: dict[int, CallRecord], expected: CallRecord,
            placements: dict[str, str]) -> tuple[CallRecord, dict[str, str]]:
    """One record holding the ranks' tensors put back together (the unsharded call's arguments:
    the shapes a sharded launch is given differ by design), and the keys not put together, with why."""
    tensors: dict[str, torch.Tensor] = {}
    unplaced: dict[str, str] = {}
    leftovers = expected.output_buffers  # what they held before the kernel wrote them: no input, not compared
    for key, want in expected.tensors.items():
        if key in leftovers:
            continue
        pieces = [record.tensors[key] for record in records.values() if key in record.tensors]
        if len(pieces) != len(records):
            continue  # only in the unsharded call: diff_call says so
        placement = _placement(op, key.partition("/")[2], placements) or _inferred(pieces, want)
        whole = _put_together(pieces, placement) if placement is not None else (
            "the ranks hold different values and no --shard placement puts them together")
        if isinstance(whole, str):
            unplaced[key] = whole
        else:
            tensors[key] = whole
    first = next(iter(records.values()))
    return dataclasses.replace(first, args=expected.args, tensors=tensors), unplaced


def _placement(op: str, name: str, placements: dict[str, str]) -> str | None:
    return next((placement for given, placement in placements.items() if names_argument(given, op, name)), None)


def _inferred(pieces: list[torch.Tensor], want: torch.Tensor) -> str | None:
    if all(p.shape == pieces[0].shape and p.dtype == pieces[0].dtype and bitwise_equal(p, pieces[0])
           for p in pieces[1:]):
        return "replicate"
    if any(p.dim() != want.dim() for p in pieces):
        return None
    dims = [d for d in range(want.dim()) if sum(p.shape[d] for p in pieces) == want.shape[d]
            and all(p.shape[o] == want.shape[o] for p in pieces for o in range(want.dim()) if o != d)]
    return f"shard:{dims[0]}" if len(dims) == 1 else None


def _put_together(pieces: list[torch.Tensor], placement: str) -> torch.Tensor | str:
    """The whole the pieces make, or why they make none (a dimension they lack, shapes that differ)."""
    first = pieces[0]
    if placement == "replicate":
        return first
    if placement == "partial":
        if any(p.shape != first.shape for p in pieces):
            return f"partial: the ranks' pieces differ in shape ({', '.join(str(list(p.shape)) for p in pieces)})"
        wide = torch.float64 if first.dtype.is_floating_point else torch.int64
        return torch.stack([p.to(wide) for p in pieces]).sum(0).to(first.dtype)
    dim = int(placement.partition(":")[2])
    if not -first.dim() <= dim < first.dim() or any(p.dim() != first.dim() for p in pieces):
        return f"{placement}: the pieces have {first.dim()} dimension(s)"
    try:
        return torch.cat(pieces, dim)
    except RuntimeError:  # the other dimensions differ
        return f"{placement}: the pieces' shapes do not line up ({', '.join(str(list(p.shape)) for p in pieces)})"

