"""A timeline as nested slices: steps, the layers inside them, calls, and the kernels each call
launched. Both the Chrome trace and the HTML page draw these.

A call's slice spans its recorded start and duration. A call recorded without them (another
engine's writer) is laid after the previous one, one microsecond long. Kernel durations are not
measured (launches are asynchronous): a call's kernels share its span in launch order, and their
args say so.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from replay.trace.timeline import TimelineCall

DEPTHS = {"step": 0, "layer": 1, "call": 2, "kernel": 3}
UNTIMED_US = 1.0


@dataclass
class Slice:
    name: str
    kind: str  # step, layer, call, kernel
    cat: str  # the op, for colour; "" for steps and layers
    ts: float  # microseconds from the recording's start
    dur: float
    args: dict[str, Any] = field(default_factory=dict)
    highlight: bool = False

    @property
    def depth(self) -> int:
        return DEPTHS[self.kind]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "cat": self.cat, "ts": self.ts, "dur": self.dur,
                "depth": self.depth, "args": self.args, "highlight": self.highlight}


def timeline_slices(calls: list[TimelineCall], failing: Iterable[int] = ()) -> list[Slice]:
    """Steps, layers, calls and kernels, outer before inner; `failing` calls are highlighted."""
    failing = set(failing)
    call_slices, kernel_slices = [], []
    cursor = 0.0
    for call in calls:
        if call.start_s is not None and call.duration_s is not None:
            ts, dur = call.start_s * 1e6, max(call.duration_s * 1e6, UNTIMED_US)
        else:  # untimed: right after the call before it
            ts, dur = cursor, UNTIMED_US
        cursor = ts + dur
        args = {"call": call.index, "variant": call.variant, **call.scope, **call.params}
        call_slices.append(Slice(f"{call.op} {call.variant}", "call", call.op, ts, dur, args,
                                 call.index in failing))
        share = dur / max(len(call.launches), 1)
        for n, launch in enumerate(call.launches):
            shown = {k: v for k, v in launch.items() if k not in ("module", "signature")}
            kernel_slices.append(Slice(str(launch.get("kernel", "?")), "kernel", call.op, ts + n * share, share,
                                       {**shown, "call": call.index, "duration": "not measured: the call's span, "
                                                                                 "shared by its kernels"}))
    return [*_groups(calls, call_slices, "step"), *_groups(calls, call_slices, "layer"), *call_slices,
            *kernel_slices]


def _groups(calls: list[TimelineCall], call_slices: list[Slice], level: str) -> list[Slice]:
    """A slice per run of consecutive calls sharing a step (and, for layers, a layer)."""
    found: list[Slice] = []
    previous: tuple | None = None
    for call, piece in zip(calls, call_slices):
        run = call.scope.get("run")  # kv-check's runs each count their steps from 0
        key = (run, call.step) if level == "step" else (run, call.step, call.layer)
        if key[-1] is None:
            previous = None
            continue
        end = piece.ts + piece.dur
        if key == previous:
            found[-1].dur = end - found[-1].ts
        else:
            args = {"step": call.step} if level == "step" else {"step": call.step, "layer": call.layer}
            found.append(Slice(f"{level} {key[-1]}", level, "", piece.ts, end - piece.ts, args))
        previous = key
    return found
