"""Recording the calls inside CUDA graphs, at every replay.

A call captured into a CUDA graph runs again at each `graph.replay()` with no Python around it,
so a recorder that copies at the call sees it once, at capture, when nothing has run yet. While
a recording is active this module wraps `torch.cuda.CUDAGraph`'s capture_begin, capture_end and
replay. At a captured call it adds to the graph a device-to-device copy of each tensor the call
reads (before it) and writes (after it) into a staging tensor of the graph's own memory pool, so
every replay refreshes them, and keeps the call's description as a tape of the graph. After each
replay the recording writes the tape's calls from the staging tensors, through the same pipeline
as any call (pinned host copies issued on the replay's stream, writer threads), each marked with
the replay it came from (`meta.graph_replay`).

Weights are not staged: a large input the call does not write, in memory allocated outside any
graph's pool and written by no earlier call of the same graph, is copied once after a replay and
stored as a blob like any weight (a flight recording stores it with each call). Where recording
cannot work (a graph captured before the recording began, a capture begun before it), the calls
or replays are counted and reported once; nothing is issued into a graph the recorder does not
follow.
"""
from __future__ import annotations

import bisect
import itertools
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from replay.snapshot.tensors import Geometry, geometry_of, storage_span

_originals: dict[str, Callable[..., Any]] = {}
_tapes: "weakref.WeakKeyDictionary[Any, Tape]" = weakref.WeakKeyDictionary()
_local = threading.local()  # .capture: the Capture under way on this thread, if any
_install_lock = threading.Lock()


@dataclass
class Staged:
    """One tensor of a captured call: `tensor` is what is copied after each replay, a staging
    span the graph refreshes (`geometry` the recorded view's), or a weight itself (`geometry` None)."""
    key: str
    what: str  # "argument 'x'", for error messages
    tensor: torch.Tensor
    geometry: Geometry | None
    reusable: bool = False  # stored as a blob (a weight)
    persistent: bool = False  # stored in chunks when large (state, mutated arguments)


@dataclass
class CapturedCall:
    spec: Any  # recorder.CallSpec
    header: dict[str, Any]  # op, variant, provider, args, returns_json, launch, meta
    tensors: list[Staged]


@dataclass
class Tape:
    """The calls captured into one graph, in order, and how often the graph has been replayed."""
    graph_id: int
    calls: list[CapturedCall] = field(default_factory=list)
    replays: int = 0
    written_later: list[str] = field(default_factory=list)  # weights a later call of the graph writes


class Capture:
    """A graph capture under way: its tape, and what memory existed outside graph pools when it began."""

    _ids = itertools.count(1)

    def __init__(self) -> None:
        self.tape = Tape(next(Capture._ids))
        self.written: set[int] = set()  # storage addresses a captured call of this graph writes
        self._outside = _default_pool_ranges()

    def outside(self, t: torch.Tensor) -> bool:
        """Whether `t` lives in memory allocated before the capture, in no graph's pool."""
        address = t.untyped_storage().data_ptr()
        i = bisect.bisect_right(self._outside, (address, float("inf"))) - 1
        return i >= 0 and self._outside[i][0] <= address < self._outside[i][1]

    def stage(self, key: str, what: str, t: torch.Tensor, persistent: bool = False) -> Staged:
        """A device copy of `t`'s storage span, made inside the graph: each replay refreshes it."""
        geometry = geometry_of(t)
        return Staged(key, what, storage_span(t.detach(), geometry).clone(), geometry, persistent=persistent)


def _default_pool_ranges() -> list[tuple[int, int]]:
    """Address ranges of the caching allocator's segments outside any graph's private pool."""
    ranges = []
    for segment in torch.cuda.memory_snapshot():
        if tuple(segment.get("segment_pool_id", (0, 0))) == (0, 0):
            ranges.append((segment["address"], segment["address"] + segment["total_size"]))
    return sorted(ranges)


def current_capture() -> Capture | None:
    return getattr(_local, "capture", None)


def capturing_untracked() -> bool:
    """A graph is being captured on this thread's stream, begun where the recorder did not see it."""
    # is_initialized: a process that never touched CUDA captures nothing, and the check is a flag read
    return current_capture() is None and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def tape_of(graph: Any) -> Tape | None:
    """The tape of `graph`, if it was captured while a recording was active."""
    return _tapes.get(graph)


def install(on_replay: Callable[[Tape | None], None], before_capture: Callable[[], bool]) -> None:
    """Wrap CUDAGraph's capture and replay. `before_capture()` runs before a capture begins (work
    on other threads must stop: a CUDA call there breaks a capture in the default, global mode) and
    says whether to follow it; `on_replay(tape)` runs after each replay (tape None for a graph
    captured where none was followed)."""
    if not torch.cuda.is_available():
        return
    with _install_lock:
        if _originals:
            return
        graph_class = torch.cuda.CUDAGraph
        begin, end, replay = graph_class.capture_begin, graph_class.capture_end, graph_class.replay
        _originals.update(capture_begin=begin, capture_end=end, replay=replay)

        def capture_begin(self: Any, *args: Any, **kwargs: Any) -> None:
            # before it begins: reading the allocator's segments is not capturable
            _local.capture = Capture() if before_capture() else None
            try:
                begin(self, *args, **kwargs)
            except BaseException:
                _local.capture = None
                raise

        def capture_end(self: Any) -> None:
            capture, _local.capture = current_capture(), None
            end(self)
            if capture is not None:
                _tapes[self] = capture.tape

        def replay_and_record(self: Any) -> None:
            replay(self)
            on_replay(_tapes.get(self))

        graph_class.capture_begin, graph_class.capture_end, graph_class.replay = \
            capture_begin, capture_end, replay_and_record


def uninstall() -> None:
    with _install_lock:
        for name, original in _originals.items():
            setattr(torch.cuda.CUDAGraph, name, original)
        _originals.clear()
