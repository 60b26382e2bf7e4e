"""Precision bisection: the fewest calls whose switch to their reference brings the end back.

A recording's final outputs (what no later call read: logits, a cache) are computed along the
kernel chain (replay/engine/propagate.py) with some calls switched to their op's reference
variant, and held against the reference chain's within the producing op's drift tolerance. The
set of switched calls is searched by delta debugging (ddmin.py) over arbitrary sets, so the
answer may be one call in the middle of a layer, not only a prefix or a suffix. Each tested set
is kept in a journal file as it is learnt, so a search stopped part way goes on where it was.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from replay.compare import Comparison, compare
from replay.code import package_source
from replay.engine.ddmin import ddmin
from replay.engine.evidence import Evidence, gather
from replay.dataflow.graph import CallNode
from replay.engine.propagate import Chains, ReplayedMemory, drift_tolerance, feed, keep, open_chains, \
    reference_of, sinks
from replay.engine.session import ReplayOptions
from replay.errors import CallUntestable

JOURNAL_NAME = "precision-journal.json"  # in the snapshot, which readers ignore (docs/FORMAT.md)


@dataclass
class PrecisionResult:
    snapshot: str
    candidates: list[int]  # calls with a reference to switch to
    finals: list[tuple[int, str]]  # the outputs judged
    minimal: list[int] | None = None  # None: nothing needs switching (the end is within tolerance)
    tests: int = 0  # sets tested in this run (the journal may have answered more)
    remembered: int = 0  # sets the journal answered
    replays: int = 0
    problems: list[str] = field(default_factory=list)
    by: str = "call"  # what was switched together: each call, each op's calls, each layer's calls
    groups: list[str] = field(default_factory=list)  # the sets found ('call 26', 'rmsnorm', 'layer 1')
    trail: list[tuple[list[int], bool]] = field(default_factory=list)  # each set asked, in order, and the answer
    evidence: list[Evidence] = field(default_factory=list)  # the final outputs off, with no call switched
    worst: Comparison | None = None  # the unswitched run's worst final output


ProgressFn = Callable[[int, tuple[int, ...], bool], None]


class _Journal:
    """Tested sets and their answers, for one snapshot and one version of the code."""

    def __init__(self, path: Path | None, identity: dict[str, Any]):
        self.path, self.identity = path, identity
        self.answers: dict[str, bool] = {}
        if path is not None and path.is_file():
            try:
                saved = json.loads(path.read_text())
            except (OSError, ValueError):
                saved = {}
            if isinstance(saved, dict) and saved.get("identity") == identity and isinstance(saved.get("answers"), dict):
                self.answers = {k: v for k, v in saved["answers"].items() if isinstance(v, bool)}

    @staticmethod
    def key(calls: tuple[int, ...]) -> str:
        return ",".join(map(str, sorted(calls)))

    def keep(self, calls: tuple[int, ...], answer: bool) -> None:
        self.answers[self.key(calls)] = answer
        if self.path is None:
            return
        text = json.dumps({"identity": self.identity, "answers": self.answers})
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            temporary.write_text(text)
            os.replace(temporary, self.path)
        except OSError as exc:  # a read-only snapshot: the search goes on, unremembered
            print(f"replay: bisect-precision: cannot keep the journal {self.path}: {exc.strerror or exc}",
                  file=sys.stderr)
            self.path = None


def _code_identity(chains: Chains) -> str:
    """A digest of every file of the packages the calls' ops and kernels come from (their providers'
    top-level packages, and the variants' own modules): another version of the kernels is another
    search."""
    modules = {name for op in chains.ops.values() for name in (op.provider, *(v.fn.__module__ for v in op.variants.values()))}
    sources = {source for name in modules if (source := package_source(name)) is not None}
    files = {f for source in sources for f in (source.rglob("*.py") if source.is_dir() else [source])}
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(str(path).encode())
        try:
            digest.update(path.read_bytes())
        except OSError:
            pass
    return digest.hexdigest()


def _chain(chains: Chains, switched: frozenset[int] | None,
           wanted: set[tuple[int, str]]) -> dict[tuple[int, str], Any]:
    """The final outputs of the kernel chain with the `switched` calls (None: every call with a
    reference) run as their reference."""
    memory, finals = ReplayedMemory(chains.graph), {}
    for node in chains.graph.nodes:
        record = chains.snapshot.load(node.index)
        op = chains.op(record)
        reference = reference_of(op, record.variant)
        chosen = reference is not None and (switched is None or node.index in switched)
        variant = reference if chosen and reference is not None else record.variant
        run = chains.run(feed(record, node, memory), variant)
        if run.error and (run.untestable or variant == reference):  # the oracle's side must run
            raise CallUntestable(f"{chains.snapshot.path}: call {node.index} ({node.op}, {variant}) failed: {run.error}")
        if run.error:  # a kernel that raises with this set switched: the end is not brought back
            return {}
        keep(node, record, run, memory)
        for name, value in run.outputs.items():
            if (node.index, f"out/{name}") in wanted:
                finals[(node.index, f"out/{name}")] = (value, op)
    return finals


def _judged(finals: dict[tuple[int, str], Any], oracle: dict[tuple[int, str], Any]) -> dict[tuple[int, str], Comparison]:
    """Each final output the oracle also makes (not an intermediate the reference skips) against
    the oracle's, within its op's drift tolerance."""
    found = {}
    for key, (value, op) in finals.items():
        if key in oracle:
            expected = oracle[key][0]
            found[key] = compare(value, expected, drift_tolerance(op, expected.dtype), same_dtype=False)
    return found


def _judge(finals: dict[tuple[int, str], Any], oracle: dict[tuple[int, str], Any]) -> tuple[bool, Comparison | None]:
    """Whether every final output is within tolerance of the oracle's, and the worst; a run that
    made none (a kernel raised) is not."""
    if not finals:
        return False, None
    judged = list(_judged(finals, oracle).values())
    failing = [c for c in judged if not c.passed]
    worst = failing[0] if failing else max(judged, key=lambda c: c.max_abs or 0.0, default=None)
    return not failing, worst


GROUPINGS = ("call", "op", "layer")


def group_of(node: CallNode, by: str) -> str:
    """The name of the set a call is switched with: itself, its op, or its layer (scope `layer`)."""
    if by == "op":
        return node.op
    if by == "layer":
        layer = node.scope.get("layer")
        return f"layer {layer}" if layer is not None else "outside any layer"
    return f"call {node.index}"


def bisect_precision(path: str | Path, options: ReplayOptions, *, by: str = "call", journal: Path | None = None,
                     use_journal: bool = True, progress: ProgressFn | None = None) -> PrecisionResult:
    """The smallest set of calls (or of ops, or of layers: `by`) to switch to their reference (see
    the module's doc)."""
    if by not in GROUPINGS:
        raise ValueError(f"by must be one of {', '.join(GROUPINGS)}, not {by!r}")
    chains, problems = open_chains(path, options)
    wanted = set(sinks(chains.graph))
    oracle = _chain(chains, None, wanted)  # every call with a reference switched; their ops known after it
    groups: dict[str, list[int]] = {}
    for node in chains.graph.nodes:
        if reference_of(chains.ops[node.index], node.variant) is not None:
            groups.setdefault(group_of(node, by), []).append(node.index)
    candidates = [i for members in groups.values() for i in members]
    result = PrecisionResult(str(path), sorted(candidates), sorted(wanted), problems=problems, by=by)
    identity = {"snapshot": _index_digest(Path(path)), "code": _code_identity(chains),
                "device": options.device, "finals": [list(f) for f in sorted(wanted)]}
    book = _Journal((journal or Path(path) / JOURNAL_NAME) if use_journal else None, identity)

    def fixes(chosen: tuple[str, ...]) -> bool:
        switched = tuple(sorted(i for name in chosen for i in groups[name]))
        key = book.key(switched)
        if key in book.answers:
            result.remembered += 1
            answer = book.answers[key]
        else:
            answer, _ = _judge(_chain(chains, frozenset(switched), wanted), oracle)
            result.tests += 1
            book.keep(switched, answer)
        result.trail.append((list(switched), answer))
        if progress:
            progress(result.tests + result.remembered, switched, answer)
        return answer

    unswitched = _chain(chains, frozenset(), wanted)
    passed, result.worst = _judge(unswitched, oracle)
    for (index, key), judged in _judged(unswitched, oracle).items():
        gathered = None if judged.passed else gather(index, key, "kernels vs references", unswitched[(index, key)][0],
                                                     oracle[(index, key)][0])
        result.evidence += [gathered] if gathered is not None else []
    if not passed:  # every group switched is the oracle itself: ddmin starts from a set that holds
        result.groups = ddmin(list(groups), fixes)
        result.minimal = sorted(i for name in result.groups for i in groups[name])
    result.replays = chains.replays
    return result


def _index_digest(path: Path) -> str:
    try:
        return hashlib.sha256((path / "calls.jsonl").read_bytes()).hexdigest()
    except OSError:
        return ""


def result_json(result: PrecisionResult) -> dict[str, Any]:
    return {"snapshot": result.snapshot, "minimal": result.minimal, "by": result.by, "groups": result.groups,
            "candidates": result.candidates, "finals": [list(f) for f in result.finals], "tests": result.tests,
            "remembered": result.remembered, "replays": result.replays, "problems": result.problems}
