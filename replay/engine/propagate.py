"""Replaying in dependency order: each call fed what its producers made when replayed.

A plain replay gives every call its recorded inputs, so a call's error is its own. Here (pypto's
localisation walk) two chains run side by side over the recording's dependency graph
(replay/dataflow/graph.py): the *kernel chain*, each call's recorded variant fed the kernel
chain's outputs of its producers, so error accumulates as it did in the program; and the
*reference chain*, the reference variant fed the reference chain's. Each call is then judged
twice, within its op's tolerance:

- its own error: the kernel against the reference on the same (kernel-chain) inputs;
- its drift: the kernel chain's output against the reference chain's.

A call with no reference (a recorded Triton launch no `replay.reference_for` names) has the
recording as its oracle: the reference chain carries its recorded outputs, its own error is the
kernel run on the reference chain's inputs against them (as a plain replay checks it), its drift
the kernel chain's output against them.

The first call whose own error crosses its tolerance is the culprit; a later call that drifts
while its own error stays within tolerance only inherits. `Chains` is also what precision
bisection (precision.py) runs, with some calls switched to their reference.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from replay.code import KernelCode
from replay.compare import Comparison, compare
from replay.dataflow.graph import Access, CallNode, DependencyGraph, Edge, checked, of_snapshot
from replay.engine.evidence import Evidence, gather
from replay.engine.runner import VariantRun, fresh_copy, run_variant
from replay.engine.session import ReplayOptions, CannotMake, op_for
from replay.errors import CallUntestable, SnapshotError
from replay.registry import REFERENCE, Op
from replay.snapshot import CallRecord, Snapshot
from replay.snapshot.tensors import storage_span
from replay.tolerance import DEFAULT, EXACT, Tolerance


class ReplayedMemory:
    """What one chain's replayed calls wrote, kept while a later call of the graph reads it."""

    def __init__(self, graph: DependencyGraph) -> None:
        self._into: dict[tuple[int, str], list[Edge]] = {}
        self._last_reader: dict[tuple[int, str], int] = {}
        for edge in graph.edges:
            self._into.setdefault((edge.consumer, edge.consumer_key), []).append(edge)
            written = (edge.producer, edge.producer_key)
            self._last_reader[written] = max(self._last_reader.get(written, -1), edge.consumer)
        self._outputs: dict[tuple[int, str], tuple[torch.Tensor, int]] = {}  # -> (bytes, their first address)

    def write(self, index: int, key: str, access: Access, value: torch.Tensor, recorded: torch.Tensor) -> None:
        """Keep `value`'s bytes laid out as the `recorded` output was (its strides, offset and dtype:
        a float32 reference's output is rounded to the bfloat16 the kernel wrote), where a later call
        reads them; a value of another shape, or one the recorded layout cannot hold, is left out
        (its readers get the recorded bytes)."""
        if (index, key) not in self._last_reader or value.shape != recorded.shape:
            return
        laid = fresh_copy(recorded, "cpu")  # the recorded bytes between the view's elements stay
        try:
            laid.copy_(value.detach())
        except RuntimeError:  # a recorded view whose elements overlap (a broadcast output) takes no copy
            return
        data = storage_span(laid).view(torch.uint8)
        if data.numel() == access.place.end - access.place.start:
            self._outputs[(index, key)] = (data, access.place.start)

    def feed(self, index: int, key: str, access: Access, recorded: torch.Tensor) -> bool:
        """Overwrite `recorded` (a tensor read back from the snapshot, changed in place) with the
        replayed bytes of the calls the graph says it read; whether any were."""
        target = storage_span(recorded).view(torch.uint8)
        fed = False
        for edge in self._into.get((index, key), ()):
            kept = self._outputs.get((edge.producer, edge.producer_key))
            if kept is None:
                continue
            data, at = kept
            for start, end in edge.pieces:
                target[start - access.place.start:end - access.place.start].copy_(data[start - at:end - at])
            fed = True
        return fed

    def done(self, index: int) -> None:
        """Let go of what no call after `index` reads."""
        for written in [w for w in self._outputs if self._last_reader[w] <= index]:
            del self._outputs[written]


@dataclass
class Fed:
    """A call's record with its read tensors overwritten by a chain's replayed memory."""

    record: CallRecord
    keys: list[str]  # the tensors that came from replayed producers


@dataclass
class Chains:
    """Calls of a snapshot run in order, each chain over its own replayed memory."""

    snapshot: Snapshot
    graph: DependencyGraph
    options: ReplayOptions
    code: KernelCode
    ops: dict[int, Op] = field(default_factory=dict)
    replays: int = 0  # variant runs made

    def op(self, record: CallRecord) -> Op:
        """The call's op; CallUntestable where this code cannot make it."""
        if record.index not in self.ops:
            try:
                self.ops[record.index] = op_for(self.code, record, self.snapshot, self.options)
            except CannotMake as exc:
                raise CallUntestable(f"{self.snapshot.path}: call {record.index}: {exc}") from None
        return self.ops[record.index]

    def run(self, fed: Fed, variant: str) -> VariantRun:
        op = self.op(fed.record)
        self.replays += 1
        return run_variant(op, op.variants[variant], fed.record.arguments(), self.options.device,
                           self.options.tag_level)


def feed(record: CallRecord, node: CallNode, memory: ReplayedMemory) -> Fed:
    """A copy of `record` whose read tensors (copied with their strides and offset, so that their
    storage holds the recorded bytes in the recorded order) hold what `memory` says was there."""
    tensors = {key: fresh_copy(t, "cpu") if key in node.reads else t for key, t in record.tensors.items()}
    copy = CallRecord(**{**record.__dict__, "tensors": tensors})
    keys = [key for key, access in node.reads.items()
            if key in tensors and memory.feed(node.index, key, access, tensors[key])]
    return Fed(copy, keys)


def keep(node: CallNode, record: CallRecord, run: VariantRun, memory: ReplayedMemory) -> None:
    """What a run wrote, kept in `memory` for the calls that read it; what no later call reads let go."""
    for name, value in run.outputs.items():
        key = f"out/{name}"
        access, recorded = node.writes.get(key), record.tensors.get(key)
        if access is not None and recorded is not None:
            memory.write(node.index, key, access, value, recorded)
    memory.done(node.index)


def reference_of(op: Op, recorded_variant: str) -> str | None:
    """The variant a call is judged against: the op's reference, unless the recorded call is it."""
    return REFERENCE if REFERENCE in op.variants and recorded_variant != REFERENCE else None


def drift_tolerance(op: Op, dtype: torch.dtype) -> Tolerance:
    """How far a chain may drift at a call: the op's tolerance, or the dtype's default where that is
    looser (an op that moves bits, held EXACT against its reference, passes on whatever error its
    inputs carried: it is not where error grows)."""
    mine, default = op.tolerance_for(dtype), DEFAULT.get(dtype, EXACT)
    return Tolerance(max(mine.atol, default.atol), max(mine.rtol, default.rtol))


def worst(actual: VariantRun, expected: VariantRun, tolerance: Callable[[torch.dtype], Tolerance]) -> Comparison | None:
    """The comparison of the first output outside `tolerance`, or of the one furthest off; None
    when the runs share no output."""
    found: list[Comparison] = []
    for name, value in actual.outputs.items():
        if name in expected.outputs:
            found.append(compare(value, expected.outputs[name], tolerance(expected.outputs[name].dtype),
                                 same_dtype=False))
    if not found:
        return None
    failing = [c for c in found if not c.passed]
    return failing[0] if failing else max(found, key=lambda c: c.max_abs or 0.0)


@dataclass
class PropagatedCall:
    index: int
    op: str
    scope: dict[str, Any]
    own: Comparison | None = None  # kernel vs reference on the kernel chain's inputs (None: no reference)
    drift: Comparison | None = None  # kernel chain vs reference chain
    fed: list[str] = field(default_factory=list)
    error: str | None = None  # a variant raised, or the call cannot be made here
    untestable: bool = False  # the error is this code's failure to make or build the call, not a verdict

    @property
    def verdict(self) -> str:
        if self.error:
            return "error"
        if self.own is not None and not self.own.passed:
            return "own error"
        if self.drift is not None and not self.drift.passed:
            return "inherits"
        return "ok"


@dataclass
class PropagationReport:
    snapshot: str
    calls: list[PropagatedCall]
    problems: list[str]
    replays: int = 0
    evidence: list[Evidence] = field(default_factory=list)  # the failing tensors of calls over their own tolerance

    @property
    def culprit(self) -> PropagatedCall | None:
        """The first call whose own error crosses its tolerance."""
        return next((c for c in self.calls if c.verdict == "own error"), None)

    @property
    def passed(self) -> bool:
        return not self.problems and all(c.verdict == "ok" for c in self.calls)

    @property
    def untestable(self) -> bool:
        return any(c.untestable for c in self.calls)


ProgressFn = Callable[[int, int, PropagatedCall], None]


def open_chains(path: str | Path, options: ReplayOptions) -> tuple[Chains, list[str]]:
    """The snapshot's graph and what runs its calls; SnapshotError when it was recorded without
    the memory footprints propagation follows."""
    snapshot = Snapshot(path, strict=False)
    graph, problems = of_snapshot(snapshot)
    return (Chains(snapshot, checked(graph, path, every_call=True), options,
                   KernelCode(options.code_dir, options.providers)), problems)


def propagate(path: str | Path, options: ReplayOptions, progress: ProgressFn | None = None) -> PropagationReport:
    """Both chains over every call of the snapshot, each call judged on its own error and its drift."""
    chains, problems = open_chains(path, options)
    report = PropagationReport(str(path), [], problems)
    kernel, reference = ReplayedMemory(chains.graph), ReplayedMemory(chains.graph)
    for done, node in enumerate(chains.graph.nodes, start=1):
        call = PropagatedCall(node.index, node.op, node.scope)
        report.calls.append(call)
        try:
            record = chains.snapshot.load(node.index)
            op = chains.op(record)
        except (SnapshotError, CallUntestable) as exc:
            call.error, call.untestable = str(exc), True
            break
        judge = reference_of(op, record.variant)
        on_kernel, on_reference = feed(record, node, kernel), feed(record, node, reference)
        call.fed = on_kernel.keys
        ran = chains.run(on_kernel, record.variant)
        if judge is not None:  # the reference chain runs the reference; the call's own error is on the same inputs
            chained = chains.run(on_reference, judge)
            own, mine, own_tolerance = chains.run(on_kernel, judge), ran, op.tolerance_for
        else:  # no reference (a recorded Triton launch): the recording is the oracle, as in a plain replay
            chained = VariantRun("recorded", outputs={n: t for n, t in record.role("out").items() if n in ran.outputs})
            own, mine, own_tolerance = chained, chains.run(on_reference, record.variant), op.rerun_tolerance_for
        keep(node, record, ran, kernel)
        keep(node, record, chained, reference)
        failed = [r for r in (ran, chained, own, mine) if r.error]
        call.error = failed[0].error if failed else None
        call.untestable = any(r.untestable for r in failed)  # a build failure; a variant that raises diverges
        if call.error is None:
            call.own = worst(mine, own, own_tolerance)
            call.drift = worst(ran, chained, functools.partial(drift_tolerance, op))
            if options.evidence and call.own is not None and not call.own.passed:
                report.evidence += [e for name, value in mine.outputs.items() if name in own.outputs
                                    for e in [gather(node.index, name, f"{record.variant} vs {own.variant}", value,
                                                     own.outputs[name], batch_axis=op.batch_axes.get(name))]
                                    if e is not None]
        if progress:
            progress(done, len(chains.graph.nodes), call)
    report.replays = chains.replays
    return report


def sinks(graph: DependencyGraph) -> list[tuple[int, str]]:
    """(call, output key) pairs no later call read: what the recorded program computed in the end."""
    consumed = graph.consumed()
    return [(n.index, key) for n in graph.nodes for key in n.writes if (n.index, key) not in consumed]



def comparison_json(c: Comparison | None) -> dict[str, Any] | None:
    return None if c is None else {"passed": c.passed, "max_abs": c.max_abs, "max_rel": c.max_rel,
                                   "mismatches": c.mismatches, "numel": c.numel, "nmse": c.nmse}


def report_json(report: PropagationReport) -> dict[str, Any]:
    culprit = report.culprit
    return {"snapshot": report.snapshot, "passed": report.passed, "culprit": culprit.index if culprit else None,
            "replays": report.replays, "problems": report.problems,
            "calls": [{"index": c.index, "op": c.op, "scope": c.scope, "verdict": c.verdict, "fed": c.fed,
                       "own": comparison_json(c.own), "drift": comparison_json(c.drift), "error": c.error}
                      for c in report.calls]}
