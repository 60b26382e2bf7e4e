"""Staging the calls inside CUDA graphs, so that every replay of a graph can be recorded.

A call captured into a CUDA graph runs again at each `graph.replay()` with no Python around it,
so a recorder that copies at the call sees it once, at capture, when nothing has run yet. While
calls are intercepted, replay/recorder/lifecycle.py wraps `torch.cuda.CUDAGraph`'s capture_begin,
capture_end and replay, and makes a Capture for each capture it follows. At a captured call the
Capture adds to the graph a device-to-device copy of each tensor the call reads (before it) and
writes (after it) into staging slabs of the graph's own memory pool, so every replay refreshes
them; the call's description goes on the graph's Tape. After each replay the recording copies
the slabs to pinned host memory (one copy a slab, on the replay's stream) and hands them over
whole (replay/recorder/graph_recording.py). The copies a graph holds are launches of one kernel
(replay/recorder/gather_copy.py), one a group of copies. In a flight recording the last of them
also copies every staging span into the next slot of a ring in device memory, so a replay costs
the host nothing and its bytes cross to the host only when the recording is dumped. This module
holds the data and the staging; it calls nothing above it.

Weights are not staged: an input the call does not write, in memory allocated outside any graph's
pool and written by no earlier call of the same graph (a weight, a buffer the host fills between
replays), is copied after a replay only when it changed (its version counter moved) and stored
once, as a blob. A tensor staged as one call's output and read, unchanged, by the next call is
staged once. Where recording
cannot work (a graph captured before the recording began, a capture begun before it), the calls
or replays are counted and reported once; nothing is issued into a graph the recorder does not
follow.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import threading
import weakref
from typing import Any

import torch

from replay.recorder import gather_copy, staging
from replay.snapshot.tensors import Geometry, storage_span

_tapes: "weakref.WeakKeyDictionary[Any, Tape]" = weakref.WeakKeyDictionary()
_kept_unrecorded: "weakref.WeakKeyDictionary[Any, Tape]" = weakref.WeakKeyDictionary()
_local = threading.local()  # .capture: the Capture under way on this thread, if any


@dataclasses.dataclass
class Staged:
    """One tensor of a captured call: `tensor` is a staging span the graph refreshes (a view into
    one of its tape's slabs, at `slab`, `offset` bytes) or, for a weight, the weight itself;
    `geometry` is the recorded view's."""
    key: str
    what: str  # "argument 'x'", for error messages
    tensor: torch.Tensor
    geometry: Geometry
    weight: bool = False  # read in place after each replay, stored as a blob
    persistent: bool = False  # stored in chunks when large (state, mutated arguments)
    slab: int = 0
    offset: int = 0

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()


@dataclasses.dataclass
class CapturedCall:
    spec: staging.CallSpec
    header: dict[str, Any]  # op, variant, provider, args, returns_json, launch, meta
    tensors: list[Staged]


SLAB_BYTES = 1 << 20  # the first slab of a device; a span this large has one of its own
MAX_SLAB_BYTES = 64 << 20
_ALIGN = 16  # staging spans start on this many bytes, so any dtype can view them


@dataclasses.dataclass
class Tape:
    """The calls captured into one graph, in order, and how often the graph has been replayed.
    Staging spans are packed into a few slabs of the graph's memory, so that a replay's tensors
    reach the host in one copy a slab (`used` bytes of each), not one a tensor."""
    graph_id: int
    calls: list[CapturedCall] = dataclasses.field(default_factory=list)
    replays: int = 0
    written_later: list[str] = dataclasses.field(default_factory=list)  # what later code in the graph writes
    slabs: list[torch.Tensor] = dataclasses.field(default_factory=list)  # uint8
    used: list[int] = dataclasses.field(default_factory=list)
    _open: dict[torch.device, int] = dataclasses.field(default_factory=dict)  # slab small spans go to
    ring: DeviceRing | None = None  # a flight recording's: every replay's spans, kept on the device
    # held across a replay and the recording's count of it, and by a dump reading the ring; the
    # stream the last recorded replay ran on (the dump reads the ring there)
    lock: threading.RLock = dataclasses.field(default_factory=threading.RLock)
    stream: Any = None
    # the graph's copy launches, in order, and the counter of the ring they read; kept with the
    # graph, which reads them at every replay
    copies: list[CopyLaunch] = dataclasses.field(default_factory=list)
    counter: torch.Tensor | None = None

    @functools.cached_property
    def weights(self) -> list[Staged]:
        """The weights of every call, in tape order (asked for after the capture has ended)."""
        return [s for call in self.calls for s in call.tensors if s.weight]

    def weight_versions(self) -> list[int | None]:
        """Each weight's version now, in tape order (None: an inference tensor's, which has none)."""
        tensors, inference = self._weight_tensors
        return [None if is_inference else t._version for t, is_inference in zip(tensors, inference)]

    @functools.cached_property
    def _weight_tensors(self) -> tuple[list[torch.Tensor], list[bool]]:
        """The weights' tensors, and which are inference tensors (a tensor never becomes one, nor
        stops being one): asked once, not at every replay."""
        tensors = [s.tensor for s in self.weights]
        return tensors, [t.is_inference() for t in tensors]

    def stage(self, tensor: staging.Tensor) -> Staged:
        """Copy the tensor's storage span into the tape's slabs now (inside a graph: each replay copies
        it again)."""
        staged, source = self.reserve(tensor)
        staged.tensor.copy_(source)
        return staged

    def reserve(self, tensor: staging.Tensor) -> tuple[Staged, torch.Tensor]:
        """Room in the tape's slabs for the tensor's storage span, and that span (to be copied in)."""
        span = storage_span(tensor.value, tensor.geometry)
        nbytes = span.numel() * span.element_size()
        slab, offset = self._room(nbytes, span.device)
        room = self.slabs[slab][offset:offset + nbytes].view(span.dtype)
        return Staged(tensor.key, tensor.what, room, tensor.geometry, persistent=tensor.persistent, slab=slab,
                      offset=offset), span

    def weight(self, tensor: staging.Tensor) -> Staged:
        return Staged(tensor.key, tensor.what, tensor.value, tensor.geometry, weight=True)

    def _room(self, nbytes: int, device: torch.device) -> tuple[int, int]:
        """Where `nbytes` go: a slab of their own when large; else the end of the device's open
        slab, or a new one (twice the last, up to MAX_SLAB_BYTES)."""
        if nbytes >= SLAB_BYTES:
            return self._new_slab(nbytes, device, nbytes), 0
        current = self._open.get(device)
        if current is None or self.used[current] + nbytes > self.slabs[current].numel():
            size = min(MAX_SLAB_BYTES, 2 * self.slabs[current].numel()) if current is not None else SLAB_BYTES
            current = self._open[device] = self._new_slab(size, device, 0)
        offset = self.used[current]
        self.used[current] = offset + -(-nbytes // _ALIGN) * _ALIGN
        return current, offset

    def _new_slab(self, size: int, device: torch.device, used: int) -> int:
        self.slabs.append(torch.empty(size, dtype=torch.uint8, device=device))
        self.used.append(used)
        return len(self.slabs) - 1


@dataclasses.dataclass
class CopyLaunch:
    """One of a graph's copy launches: its table of rows, and whether it turns the ring."""
    table: torch.Tensor
    advance: bool = False


@dataclasses.dataclass
class RingPlan:
    """A flight recording's device rings: each graph captured while it records gets room for the
    replays its host ring can hold (the last `calls` calls, within `max_bytes`) and the one under
    way, while the rings of all its graphs fit in `max_bytes` together (`left`); a graph that does
    not fit gets none (its replays come over to the host as in a full recording)."""
    calls: int
    max_bytes: int
    left: int = -1  # bytes not yet given to a ring (-1: all of max_bytes)

    def held(self, calls_a_replay: int, slot_bytes: int) -> int:
        """The most replays of such a graph the host ring holds: ceil(calls / calls_a_replay), and
        no more than fit in max_bytes (the newest at least)."""
        return min(-(-self.calls // max(calls_a_replay, 1)), max(1, self.max_bytes // max(slot_bytes, 1)))

    def take(self, calls_a_replay: int, slot_bytes: int) -> int:
        """Slots for a graph's ring, taken from what is left (0: it does not fit)."""
        slots = self.held(calls_a_replay, slot_bytes) + 1
        left = self.max_bytes if self.left < 0 else self.left
        if slots * slot_bytes > left:
            return 0
        self.left = left - slots * slot_bytes
        return slots


@dataclasses.dataclass
class DeviceRing:
    """The last `slots` replays' staging spans in device memory, each slab's used bytes at
    `starts[slab]` of a slot (None: a slab on another device, which the graph does not refresh).
    The tape's counter (device) counts the replays run since the capture: replay n (from 1) filled
    slot (n - 1) % slots, whether or not a recording saw it."""
    memory: torch.Tensor  # uint8 [slots, slot_bytes]
    starts: list[int | None]

    @property
    def slots(self) -> int:
        return self.memory.shape[0]

    @property
    def slot_bytes(self) -> int:
        return self.memory.shape[1]

    def back(self, turns: int, behind: int) -> int | None:
        """The slot of the replay `behind` replays before the last of `turns` (None: reused since)."""
        return (turns - 1 - behind) % self.slots if 0 <= behind < min(turns, self.slots) else None


@dataclasses.dataclass
class _Deferred:
    """A staging copy not yet made: `span` of `tensor` (at `version`) into `staging`."""
    staging: torch.Tensor
    span: torch.Tensor
    tensor: torch.Tensor  # whose storage a write names, and whose version is read at the end
    version: int
    what: str


class Capture:
    """A graph capture under way: its tape, what memory existed outside graph pools when it began,
    and the staging copies it has put off.

    A staged tensor keeps its value until something writes it, so its staging copy is put off:
    made just before a captured call that declares it writes that storage (`before_write`), or
    with every other one left, in one batched copy at the end of the graph (`finish`). The graph
    then holds a few copies, not one a tensor. The same view of the same storage at the same
    version is staged once (an output read by the next call). What a capture stages is held until
    it ends, so its memory goes to no other tensor meanwhile; a write through torch moves the
    version, and one found at the end is reported (its calls hold the value at the end of the
    graph). A kernel writing a tensor its op does not declare in `mutates` goes unseen, as it does
    for weights. Inference tensors have no version: they are copied at once; so are tensors on
    another device than the graph's (at the capture: the graph does not refresh them)."""

    _ids = itertools.count(1)

    def __init__(self, device: torch.device = torch.device("cpu"), ring: RingPlan | None = None) -> None:
        """Made before the capture begins (what it allocates and launches here is not captured)."""
        self.tape = Tape(next(Capture._ids))
        self.written: set[int] = set()  # storage addresses a captured call of this graph writes
        self._outside = _default_pool_ranges()
        self._staged: dict[tuple, Staged] = {}  # by storage address, geometry and version
        self._deferred: list[_Deferred] = []
        self._held: list[torch.Tensor] = []  # every tensor staged, alive until the capture ends
        self._rooms: dict[tuple[int, int], Staged] = {}  # every staging span, by slab and offset
        self._ring = ring
        self._device = device
        self._counter = self.tape.counter = gather_copy.new_counter(device)
        self._unfilled: list[tuple[torch.Tensor, torch.Tensor]] = []  # (table, its rows): filled at the end
        if device.type == "cuda":
            gather_copy.warm(device)  # compiled now: a capture that compiles it would capture the loading

    def stage(self, op: str, tensor: staging.Tensor) -> Staged:
        """A tensor passed to or returned by `op`, staged: its copy made now (an inference tensor) or
        put off."""
        t = tensor.value
        if t.is_inference() or t.device != self._device:  # no version; or memory the copy kernel cannot reach
            staged = self.tape.stage(tensor)
            self._rooms[(staged.slab, staged.offset)] = staged
            return staged
        ident = (t.untyped_storage().data_ptr(), tensor.geometry, t._version)
        same = self._staged.get(ident)
        if same is not None:
            return dataclasses.replace(same, key=tensor.key, what=tensor.what, persistent=tensor.persistent)
        staged, span = self.tape.reserve(tensor)
        self._staged[ident] = self._rooms[(staged.slab, staged.offset)] = staged
        self._held.append(t)
        self._deferred.append(_Deferred(staged.tensor, span, t, t._version, f"op '{op}' {tensor.what}"))
        return staged

    def outside(self, t: torch.Tensor) -> bool:
        """Whether `t` lives in memory allocated before the capture, in no graph's pool."""
        address = t.untyped_storage().data_ptr()
        i = bisect.bisect_right(self._outside, (address, float("inf"))) - 1
        return i >= 0 and self._outside[i][0] <= address < self._outside[i][1]

    def before_write(self, tensors: list[torch.Tensor]) -> None:
        """A captured call is about to write `tensors`: make the copies put off of their storage."""
        addresses = {t.untyped_storage().data_ptr() for t in tensors}
        now: list[_Deferred] = []
        later: list[_Deferred] = []
        for deferred in self._deferred:
            (now if deferred.tensor.untyped_storage().data_ptr() in addresses else later).append(deferred)
        self._deferred = later
        if now:
            self._launch([row for d in now for row in _rows(d.span, d.staging)], advance=False)

    def finish(self) -> None:
        """At the end of the graph (still capturing): make every copy left, in one launch; in a
        flight recording the same launch copies every staging span into the device ring's slot
        and turns the ring."""
        self.tape.written_later += [d.what for d in self._deferred if d.tensor._version != d.version]
        # a ring if the recording asks for one and has room left for it (else replays come over whole)
        ring = self.tape.ring = self._new_ring(self._ring) if self._ring is not None and self.tape.calls else None
        if ring is None:
            if self._deferred:
                self._launch([row for d in self._deferred for row in _rows(d.span, d.staging)], advance=False)
            self._deferred = []
            return
        pending = {d.staging.data_ptr(): d for d in self._deferred}
        table = []
        for room in self._rooms.values():
            start = ring.starts[room.slab]
            if start is None:
                continue
            into = ring.memory.data_ptr() + start + room.offset
            deferred = pending.get(room.tensor.data_ptr())
            table += (_rows(deferred.span, deferred.staging, into, ring.slot_bytes) if deferred is not None
                      else _rows(room.tensor, None, into, ring.slot_bytes))  # copied earlier: from its span
        self._deferred = []
        # a launch that turns the ring has a program even when it copies nothing
        self._launch(table or [[self._counter.data_ptr(), 0, 0, 0, 0]], advance=True)

    def filled(self) -> None:
        """The capture has ended: fill the tables its launches read at each replay, and set the
        ring at its first slot (where launches ran while capturing, as on the CPU, they turned it)."""
        for table, rows in self._unfilled:
            table.copy_(rows)
        self._unfilled = []
        if self._device.type != "cuda":  # a capture runs nothing; here the launches ran and turned it
            self._counter.zero_()

    def _new_ring(self, plan: RingPlan) -> DeviceRing | None:
        starts: list[int | None] = []
        at = 0
        for slab, used in zip(self.tape.slabs, self.tape.used):
            starts.append(at if slab.device == self._device else None)
            at += -(-used // _ALIGN) * _ALIGN if slab.device == self._device else 0
        at = max(at, _ALIGN)
        slots = plan.take(len(self.tape.calls), at)
        return DeviceRing(torch.empty(slots, at, dtype=torch.uint8, device=self._device), starts) if slots else None

    def _launch(self, table: list[list[int]], advance: bool) -> None:
        if not table:  # spans of no bytes
            return
        rows = torch.tensor(table, dtype=torch.int64)
        if self._device.type == "cuda":
            device_table = torch.empty_like(rows, device=self._device)  # no kernel: not a node of the graph
            self._unfilled.append((device_table, rows))
        else:
            device_table = rows
        launch = CopyLaunch(device_table, advance)
        run_copy(self.tape, launch)
        self.tape.copies.append(launch)


def run_copy(tape: Tape, launch: CopyLaunch) -> None:
    """One of the tape's copy launches, as the graph makes it at each replay."""
    assert tape.counter is not None
    gather_copy.launch(launch.table, tape.counter, tape.ring.slots if tape.ring is not None else 1, launch.advance)


def _rows(source: torch.Tensor, staging: torch.Tensor | None, ring: int = 0, stride: int = 0) -> list[list[int]]:
    """The table rows copying `source`'s bytes to `staging` (None: to the ring only)."""
    nbytes = source.numel() * source.element_size()
    return gather_copy.rows(source.data_ptr(), staging.data_ptr() if staging is not None else 0, nbytes, ring, stride)


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


def begin(follow: bool, ring: RingPlan | None = None) -> None:
    """A capture is about to begin on this thread's current CUDA device: followed (a Capture made,
    with a device ring when `ring` is given) or not."""
    _local.capture = Capture(torch.device("cuda", torch.cuda.current_device()), ring) if follow else None


def end() -> Capture | None:
    """The capture on this thread has ended (or failed to begin): the Capture that followed it."""
    capture, _local.capture = current_capture(), None
    return capture


def keep(graph: Any, tape: Tape, recorded: bool = True) -> None:
    """`graph`'s capture was followed: its replays are recorded from `tape` (or, where staging it
    failed, not, while the copies it did put into the graph keep their tables and slabs)."""
    (_tapes if recorded else _kept_unrecorded)[graph] = tape
