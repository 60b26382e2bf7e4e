"""A snapshot's calls as a timeline: step and layer (the `replay.scope` labels recorded with each
call), op, variant, start and duration, the key parameters, and each kernel launch's name, grid,
warps, stages, registers, shared memory and path.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from replay.errors import ReplayError
from replay.summary import key_params
from replay.snapshot import Snapshot
from replay.snapshot.reader import CallEntry
from replay.triton_launches.launch_record import launch_record

LAUNCH_FIELDS = ("kernel", "grid", "num_warps", "num_stages", "registers", "shared", "stack", "path", "hash",
                 "binds", "resources_from")


@dataclass
class TimelineCall:
    index: int
    op: str
    variant: str
    scope: dict[str, Any]
    start_s: float | None
    duration_s: float | None
    params: dict[str, Any]
    launches: list[dict[str, Any]] = field(default_factory=list)

    @property
    def step(self) -> Any:
        return self.scope.get("step")

    @property
    def layer(self) -> Any:
        return self.scope.get("layer")

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "op": self.op, "variant": self.variant, "scope": self.scope,
                "start_s": self.start_s, "duration_s": self.duration_s, "params": self.params,
                "launches": self.launches}


def build_timeline(snapshot: Snapshot, wanted: Callable[[CallEntry], bool] = lambda entry: True,
                   scope_wanted: Callable[[dict[str, Any]], bool] = lambda scope: True) -> list[TimelineCall]:
    """The calls of `snapshot` that `wanted` and `scope_wanted` keep, in call order."""
    calls = []
    for entry in snapshot.entries:
        if not wanted(entry):
            continue
        record = snapshot.load(entry)
        meta = record.meta
        scope = given if isinstance(given := meta.get("scope"), dict) else {}
        if not scope_wanted(scope):
            continue
        calls.append(TimelineCall(entry.index, entry.op, entry.variant, scope, _number(meta.get("start_s")),
                                  _number(meta.get("duration_s")), key_params(record.arguments()),
                                  [launch_summary(launch) for launch in
                                   (record.launch if record.triton is None else [launch_record(record)])]))
    return calls


def launch_summary(launch: dict[str, Any]) -> dict[str, Any]:
    """What a timeline shows of a launch record: its fields above, and its constexprs (those its
    signature names, and the upper-case ones kernels/launch.py records: block sizes)."""
    summary = {key: launch[key] for key in LAUNCH_FIELDS if key in launch}
    kinds = signature if isinstance(signature := launch.get("signature"), dict) else {}
    nested = launch.get("constexprs")  # a recorded Triton launch's (triton_launches/launch_record.py)
    constexprs = dict(nested) if isinstance(nested, dict) else \
        {key: value for key, value in launch.items() if key.isupper() or kinds.get(key) == "constexpr"}
    if constexprs:
        summary["constexprs"] = constexprs
    for key in ("module", "signature", "dtypes"):  # what compiling it again needs (--resources)
        if key in launch:
            summary[key] = launch[key]
    return summary


def scope_filter(steps: Iterable[Any] = (), layers: Iterable[Any] = ()) -> Callable[[dict[str, Any]], bool]:
    """A scope filter keeping the given steps and layers (compared as text: labels may be either)."""
    steps, layers = tuple(steps), tuple(layers)
    step_text, layer_text = {str(s) for s in steps}, {str(l) for l in layers}

    def keep(scope: dict[str, Any]) -> bool:
        return (not steps or str(scope.get("step")) in step_text) and \
            (not layers or str(scope.get("layer")) in layer_text)
    return keep


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def failing_calls(report: Path) -> set[int]:
    """The calls a `replay run --json` report says failed."""
    try:
        data = json.loads(report.read_text())
        return {int(c["index"]) for c in data["calls"] if not c["passed"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ReplayError(f"{report}: not a `replay run --json` report ({type(exc).__name__}: {exc})") from None
