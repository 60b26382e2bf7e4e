"""`replay diff SHARDED UNSHARDED`: a tensor-parallel recording put back together, call by call,
and compared with a recording of the same model on one rank.

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
import fnmatch
import re
from collections import Counter, defaultdict
from pathlib import Path
import torch

from replay.compare import bitwise_equal
from replay.engine.diff import CallDiff, DiffReport, diff_call
from replay.errors import ReplayError
from replay.metrics import Metric
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
    by_op: dict[str, list[int]] = defaultdict(list)
    for entry in whole.entries:
        by_op[entry.op].append(entry.index)
    per_rank = {rank: _by_op(snapshot) for rank, snapshot in snapshots.items()}
    lowest = min(snapshots)
    seen: Counter[str] = Counter()
    for position, entry in enumerate(e for e in snapshots[lowest].entries if not is_collective_op(e.op)):
        ordinal = seen[entry.op]
        seen[entry.op] += 1
        if ordinal >= len(by_op[entry.op]) or any(len(calls.get(entry.op, [])) <= ordinal
                                                   for calls in per_rank.values()):
            continue
        records = {rank: snapshots[rank].load(calls[entry.op][ordinal]) for rank, calls in per_rank.items()}
        expected = whole.load(by_op[entry.op][ordinal])
        merged, unplaced = _merged(entry.op, records, expected, placements)
        report.calls_compared += 1
        compared = dataclasses.replace(expected, tensors={k: v for k, v in expected.tensors.items() if k not in unplaced})
        differences = diff_call(merged, compared, tolerance, metric)
        differences += [{"tensor": key, "problem": "not compared: the ranks hold different values and no "
                         "--shard placement puts them together"} for key in unplaced]
        if differences:
            report.calls.append(CallDiff(position, entry.index, expected.index, entry.op, ordinal, differences))
    for op in sorted(set(seen) | set(by_op)):
        if seen[op] != len(by_op[op]):
            report.structural.append(f"op '{op}': {seen[op]} calls sharded, {len(by_op[op])} unsharded")
    return report


def _by_op(snapshot: Snapshot) -> dict[str, list[int]]:
    calls: dict[str, list[int]] = defaultdict(list)
    for entry in snapshot.entries:
        calls[entry.op].append(entry.index)
    return calls


def _merged(op: str, records: dict[int, CallRecord], expected: CallRecord,
            placements: dict[str, str]) -> tuple[CallRecord, list[str]]:
    """One record holding the ranks' tensors put back together (the unsharded call's arguments:
    the shapes a sharded launch is given differ by design), and the keys left unplaced."""
    tensors: dict[str, torch.Tensor] = {}
    unplaced = []
    leftovers = {f"in/{name}" for name in (expected.triton or expected.torch_op or {}).get("write_only", ())}
    for key, want in expected.tensors.items():
        if key in leftovers:  # what an output buffer held before the kernel wrote it: no input, not compared
            continue
        pieces = [record.tensors[key] for record in records.values() if key in record.tensors]
        if len(pieces) != len(records):
            continue  # only in the unsharded call: diff_call says so
        placement = _placement(op, key.partition("/")[2], placements) or _inferred(pieces, want)
        if placement is None:
            unplaced.append(key)
            continue
        tensors[key] = _put_together(pieces, placement)
    first = next(iter(records.values()))
    return dataclasses.replace(first, args=expected.args, tensors=tensors), unplaced


def _placement(op: str, name: str, placements: dict[str, str]) -> str | None:
    for given, placement in placements.items():
        op_glob, _, arg = given.rpartition(":")
        if arg == name and (not op_glob or fnmatch.fnmatchcase(op, op_glob)
                            or fnmatch.fnmatchcase(op.rsplit(".", 1)[-1], op_glob)):
            return placement
    return None


def _inferred(pieces: list[torch.Tensor], want: torch.Tensor) -> str | None:
    if all(p.shape == pieces[0].shape and p.dtype == pieces[0].dtype and bitwise_equal(p, pieces[0])
           for p in pieces[1:]):
        return "replicate"
    dims = [d for d in range(want.dim()) if sum(p.shape[d] for p in pieces) == want.shape[d]
            and all(p.dim() == want.dim() and all(p.shape[o] == want.shape[o] for o in range(want.dim()) if o != d)
                    for p in pieces)]
    return f"shard:{dims[0]}" if len(dims) == 1 else None


def _put_together(pieces: list[torch.Tensor], placement: str) -> torch.Tensor:
    if placement == "replicate":
        return pieces[0]
    if placement == "partial":
        wide = torch.float64 if pieces[0].dtype.is_floating_point else torch.int64
        return torch.stack([p.to(wide) for p in pieces]).sum(0).to(pieces[0].dtype)
    return torch.cat(pieces, int(placement.partition(":")[2]))

