"""Recorded collectives checked across ranks: what each member got, against what the collective
makes of every member's recorded inputs.

One rank's collective cannot run again alone, but all of them together say what it had to
return: an all_reduce the reduction of every member's input (computed in float64; a floating
sum or average of more than two members within the rounding any order of summing can make,
(n + 1) * u * sum(|x|) an element; bitwise for two members, min, max and integers), an
all_gather their concatenation, a reduce_scatter this member's share of the reduction, a
broadcast the source's input (bitwise). The k-th collective of a kind on a group in one rank is
paired with the k-th of that kind and group in every other.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

from replay.compare import compare, row_ranges
from replay.ranks.layout import RankSet
from replay.ranks.recording import is_collective_op
from replay.snapshot import CallRecord, Snapshot
from replay.tolerance import REDUCTION, Tolerance

_REDUCE = {"sum": lambda t: t.sum(0), "avg": lambda t: t.mean(0), "product": lambda t: t.prod(0),
           "min": lambda t: t.amin(0), "max": lambda t: t.amax(0)}
_BITWISE = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}


@dataclass
class CollectiveCheck:
    kind: str
    ordinal: int  # this is the group's `ordinal`-th collective of this kind (from 0)
    group: tuple[int, ...]
    calls: dict[int, int]  # rank -> its call index
    failures: list[dict[str, Any]] = field(default_factory=list)  # rank, tensor, comparison
    untested: str | None = None  # why it could not be checked: a member's recording is missing (a failure)
    uncheckable: str | None = None  # what it does is not in the recording (premul_sum's factor): said, not failed

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "ordinal": self.ordinal, "group": list(self.group),
                "calls": {str(r): i for r, i in self.calls.items()}, "passed": self.passed,
                "untested": self.untested, "uncheckable": self.uncheckable, "failures": self.failures}


def check_collectives(ranks: RankSet) -> list[CollectiveCheck]:
    """Every recorded collective, paired across its group's ranks and checked."""
    snapshots = {rank: Snapshot(path, strict=False) for rank, path in ranks.ranks.items()}
    paired: dict[tuple[str, tuple[int, ...], int], dict[int, int]] = defaultdict(dict)
    for rank, snapshot in snapshots.items():
        seen: Counter[tuple[str, tuple[int, ...]]] = Counter()
        for entry in snapshot.entries:
            if not is_collective_op(entry.op):
                continue
            header = snapshot.describe(entry).get("collective") or {}
            key = (str(header.get("kind")), tuple(header.get("group") or range(ranks.world_size)))
            paired[(key[0], key[1], seen[key])][rank] = entry.index
            seen[key] += 1
    checks = []
    for (kind, group, ordinal), calls in paired.items():
        check = CollectiveCheck(kind, ordinal, group, dict(sorted(calls.items())))
        absent = [r for r in group if r not in snapshots]
        silent = [r for r in group if r in snapshots and r not in calls]
        if absent:
            check.untested = f"rank(s) {row_ranges(absent)} of the group were not recorded"
        elif silent:  # the others waited on a collective these ranks never made: a hang, or a rank gone astray
            check.failures += [{"rank": r, "tensor": "-", "problem": f"made no {kind} {ordinal} on group "
                                f"{list(group)}, which the group's other ranks made"} for r in silent]
        else:
            _check(check, {r: snapshots[r].load(calls[r]) for r in group})
        checks.append(check)
    return sorted(checks, key=lambda c: (min(c.calls.values()), c.kind))


def _check(check: CollectiveCheck, members: dict[int, CallRecord]) -> None:
    header = next(iter(members.values())).collective or {}
    if header.get("reduce_op") == "premul_sum":
        check.uncheckable = "premul_sum: its scale factor is not recorded"
        return
    inputs = {rank: _read(record) for rank, record in members.items()}
    # a sum in any order is held to its rounding bound, which scales with the members' |x|
    absolute = ({rank: {n: t.to(torch.float64).abs() for n, t in named.items()} for rank, named in inputs.items()}
                if _summed_in_any_order(check.kind, header, len(members)) else None)
    for position, (rank, record) in enumerate(members.items()):
        outputs = list(record.role("out").items())
        try:
            expected = _expected(check.kind, header, inputs, position, len(outputs))
            scales = _expected(check.kind, header, absolute, position, len(outputs)) if absolute else None
        except (RuntimeError, ValueError, KeyError, IndexError) as exc:  # shapes that cannot make the collective
            check.failures.append({"rank": rank, "tensor": "in", "problem": f"its inputs cannot make this "
                                   f"{check.kind}: {' '.join(str(exc).split())}"})
            continue
        if len(expected) != len(outputs):
            check.failures.append({"rank": rank, "tensor": "out", "problem": f"{len(outputs)} outputs recorded, "
                                   f"the {check.kind} makes {len(expected)}"})
            continue
        for n, ((name, got), want) in enumerate(zip(outputs, expected)):
            if want.shape != got.shape and want.numel() == got.numel():
                want = want.reshape(got.shape)  # NCCL's stacked forms: [world, *shape] for [world * n, ...]
            tolerance = _tolerance(check.kind, header, got.dtype, len(members))
            if scales is not None and got.dtype.is_floating_point:
                want, tolerance = _within_rounding(got, want, scales[n], len(members)), None
            comparison = compare(got, want, tolerance, 0 if got.dim() else None)
            if not comparison.passed:
                check.failures.append({"rank": rank, "tensor": f"out/{name}", "problem": "differs from what the "
                                       f"{check.kind} makes of the ranks' inputs", "comparison": comparison.to_json()})


def _read(record: CallRecord) -> dict[str, torch.Tensor]:
    """What the collective read: its inputs, not its output buffers as they were before (`output`,
    `output_<i>`: written, never read; an in-place collective's `tensor` is both)."""
    return {name: t for name, t in record.role("in").items() if not name.startswith("output")}


def _expected(kind: str, header: dict[str, Any], inputs: dict[int, dict[str, torch.Tensor]], position: int,
              outputs: int) -> list[torch.Tensor]:
    """What the member at `position` in its group must hold after the collective, as `outputs`
    tensors (an all_gather into a list has one a member)."""
    first = [list(named.values()) for named in inputs.values()]
    dim = int(header.get("dim", 0))
    if kind == "broadcast":
        return [inputs[header["src"]]["tensor"]]
    if kind == "all_reduce":
        return [_reduced(header, [tensors[0] for tensors in first])]
    if kind == "all_gather":
        gathered = [tensors[0] for tensors in first]
        return gathered if outputs == len(gathered) > 1 else [torch.cat(gathered, dim)]
    if kind == "reduce_scatter":
        shares = [tensors if len(tensors) > 1 else list(tensors[0].chunk(len(first), dim)) for tensors in first]
        return [_reduced(header, [share[position] for share in shares])]
    raise ValueError(f"unknown collective kind '{kind}'")


def _reduced(header: dict[str, Any], tensors: list[torch.Tensor]) -> torch.Tensor:
    op = header.get("reduce_op", "sum")
    dtype = tensors[0].dtype
    if op in _BITWISE:
        out = tensors[0]
        for t in tensors[1:]:
            out = _BITWISE[op](out, t)
        return out
    wide = torch.float64 if dtype.is_floating_point else torch.int64
    stacked = torch.stack([t.to(wide) for t in tensors])
    if op == "avg" and not dtype.is_floating_point:
        return (stacked.sum(0) // len(tensors)).to(dtype)
    return _REDUCE[op](stacked).to(dtype)


def _summed_in_any_order(kind: str, header: dict[str, Any], members: int) -> bool:
    """A sum or average of more than two members: the backend picks the order (a ring, a tree)
    and rounds each partial sum to the dtype, so no one bitwise answer exists."""
    reduces = kind in ("all_reduce", "reduce_scatter") and header.get("reduce_op", "sum") in ("sum", "avg")
    return reduces and (members > 2 or header.get("reduce_op") == "avg")


def _within_rounding(got: torch.Tensor, exact: torch.Tensor, magnitude: torch.Tensor, members: int) -> torch.Tensor:
    """`exact` where `got` is further from it than summing `members` terms in got's dtype can
    round (each of the n-1 partial sums and the final scaling or rounding of the reference adds
    at most u * sum(|x|)), `got` elsewhere: compared bitwise, only elements past the bound differ,
    and they are reported against the float64 result."""
    unit = torch.finfo(got.dtype).eps / 2
    bound = (members + 1) * unit * magnitude.reshape(got.shape)
    error = (got.to(torch.float64) - exact.to(torch.float64).reshape(got.shape)).abs()
    return torch.where(error <= bound, got, exact.reshape(got.shape).to(got.dtype))


def _tolerance(kind: str, header: dict[str, Any], dtype: torch.dtype, members: int) -> Tolerance | None:
    """Bitwise, but for a floating product of more than two terms, whose order the backend
    chooses (sums and averages are held to their rounding bound instead)."""
    multiplies = kind in ("all_reduce", "reduce_scatter") and header.get("reduce_op") == "product"
    if not multiplies or not dtype.is_floating_point or members <= 2:
        return None
    return REDUCTION.get(dtype, Tolerance(1e-12, 1e-12))
