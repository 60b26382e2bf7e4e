"""Timeline slices as Chrome trace-event JSON (the format Perfetto and chrome://tracing open):
complete events ("ph": "X") on one thread, nested by time (steps > layers > calls > kernels)."""
from __future__ import annotations

from typing import Any

from replay.trace.slices import Slice


def chrome_trace(slices: list[Slice], title: str) -> dict[str, Any]:
    """The trace-event document: metadata naming the process and thread, then one complete event a
    slice, sorted by start and, at one start, outermost first (as the viewers nest them)."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": title}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 1, "args": {"name": "recorded calls"}},
    ]
    for piece in sorted(slices, key=lambda s: (s.ts, s.depth)):
        events.append({"name": piece.name, "cat": piece.kind + (f",{piece.cat}" if piece.cat else ""), "ph": "X",
                       "ts": round(piece.ts, 3), "dur": round(piece.dur, 3), "pid": 1, "tid": 1,
                       "args": {**piece.args, **({"failing": True} if piece.highlight else {})}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}
