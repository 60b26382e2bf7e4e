"""The dependency graph of a recording, and the races in it, from the calls' footprints alone.

Each recorded call says where its tensors lived (`meta.memory`: device and byte range per key)
and, on a GPU, its stream and that stream's vector clock at issue (`meta.order`,
replay/recorder/stream_order.py). Walking the calls in order with the last writer of every
byte painted over memory (intervals.py) links each tensor a call read to the call that wrote
those bytes last: an edge. Two accesses of the same bytes, one a write, from calls on different
streams that no event or wait orders are a race. Nothing here builds a tensor or imports an op
(a call's description is read from its file, which holds its tensors too: reading a graph reads
the snapshot's call files). A footprint is the span of bytes from a view's first element to its
last: two views that interleave within one span (the columns of a fused QKV output) count as
overlapping, so a race between them, or an uninitialised gap between a writer's rows, can be a
false alarm.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from replay.dataflow.intervals import IntervalMap
from replay.errors import SnapshotError
from replay.snapshot import Snapshot


@dataclass(frozen=True)
class Place:
    """Bytes [start, end) of a device's memory, by the addresses they had while recorded."""

    device: str
    start: int
    end: int


@dataclass(frozen=True)
class Access:
    """A tensor of a call: its bytes, the storage they belonged to (a number the recording gave it;
    None when not recorded) and that storage's version counter then (None: not known)."""

    place: Place
    storage: int | None = None
    version: int | None = None


@dataclass
class CallNode:
    index: int
    op: str
    variant: str
    scope: dict[str, Any] = field(default_factory=dict)
    stream: str | None = None  # None: not on a GPU stream the recording saw (ordered with every call)
    clock: dict[str, int] = field(default_factory=dict)
    reads: dict[str, Access] = field(default_factory=dict)  # tensor key -> its bytes
    writes: dict[str, Access] = field(default_factory=dict)
    unread: dict[str, Access] = field(default_factory=dict)  # buffers it only writes, as they were before
    footprint: bool = True  # False: recorded without `meta.memory` (an older recorder, another producer)

    @property
    def state(self) -> list[str]:
        return [key for key in self.reads if key.startswith("state/")]


@dataclass(frozen=True)
class Edge:
    """`consumer` read, as `consumer_key`, bytes `producer` wrote last, as `producer_key`: `pieces`
    exactly ([start, end) each, in address order), `place` from the first to the last."""

    producer: int
    consumer: int
    producer_key: str
    consumer_key: str
    place: Place
    pieces: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Race:
    """Two calls touching the same bytes, at least one writing, with nothing ordering them."""

    first: int
    second: int
    first_key: str
    second_key: str
    kind: str  # "write then read", "write then write", "read then write"
    place: Place

    def describe(self) -> str:
        return (f"calls {self.first} ({self.first_key}) and {self.second} ({self.second_key}): {self.kind} of "
                f"{self.place.device} bytes [{self.place.start:#x}, {self.place.end:#x}) "
                f"({self.place.end - self.place.start} bytes) on different streams with no event or wait between")


@dataclass(frozen=True)
class Unwritten:
    """`reader` read, as `key`, bytes of memory that recorded calls allocated their outputs in (a
    buffer first seen fresh, as a kernel's write-only argument) but no recorded call wrote."""

    reader: int
    key: str
    place: Place

    def describe(self) -> str:
        return (f"call {self.reader} ({self.key}) reads {self.place.end - self.place.start} bytes "
                f"[{self.place.start:#x}, {self.place.end:#x}) of {self.place.device} that no recorded call wrote, "
                "in a buffer recorded calls write their outputs into: uninitialised memory, unless a launch the "
                "recording left out (--only/--skip) wrote them")


@dataclass
class DependencyGraph:
    nodes: list[CallNode]
    edges: list[Edge]
    races: list[Race]
    unwritten: list[Unwritten] = field(default_factory=list)

    @property
    def without_footprint(self) -> list[int]:
        return [n.index for n in self.nodes if not n.footprint]

    def producers(self, index: int) -> list[Edge]:
        return [e for e in self.edges if e.consumer == index]

    def consumed(self) -> set[tuple[int, str]]:
        """(call, output key) pairs some later call read."""
        return {(e.producer, e.producer_key) for e in self.edges}


def node_of(index: int, header: dict[str, Any]) -> CallNode:
    """A call's node from its description (docs/FORMAT.md): reads are its input and state tensors
    but those it writes without reading (write_only), writes its outputs."""
    meta = header.get("meta") or {}
    memory = meta.get("memory")
    order = meta.get("order") or {}
    scope = meta.get("scope")
    node = CallNode(index, header["op"], header["variant"], dict(scope) if isinstance(scope, dict) else {},
                    order.get("stream"),
                    dict(order.get("clock") or {}), footprint=memory is not None)
    write_only = set((header.get("triton") or header.get("torch_op") or {}).get("write_only") or ())
    for key, where in (memory or {}).items():
        role, _, name = key.partition("/")
        access = Access(Place(where["device"], where["start"], max(where["start"], where["end"])),
                        where.get("storage"), where.get("version"))
        if role == "out":
            node.writes[key] = access
        elif role in ("in", "state"):
            (node.unread if name in write_only else node.reads)[key] = access
    return node


def _ordered(a: CallNode, b: CallNode) -> bool:
    """Whether `a`, issued before `b`, is known to finish before `b` starts (or may be assumed to:
    a call with no stream recorded is ordered with everything)."""
    if a.stream is None or b.stream is None or a.stream == b.stream:
        return True
    return b.clock.get(a.stream, 0) >= a.clock.get(a.stream, 1)


class _Walk:
    """Calls in issue order over painted memory: who wrote each byte last, who read it since.

    A storage's version counter moves with every write torch sees. A reader that finds its
    storage at another version than the last recorded access left it knows something unrecorded
    wrote it since: the storage starts a new epoch, and bytes painted in an earlier one are no
    longer what their writer left (no edge)."""

    def __init__(self) -> None:
        self.nodes: dict[int, CallNode] = {}
        # per byte: (writer, its key, storage, epoch)
        self.writers: dict[str, IntervalMap[tuple[int, str, int | None, int]]] = {}
        # per byte, the last reader on each stream since the last write (a later write ordered after
        # a stream's last read is ordered after its earlier ones)
        self.readers: dict[str, IntervalMap[dict[str, tuple[int, str, int | None]]]] = {}
        self.versions: dict[int, int] = {}  # storage -> the version its last recorded access saw
        self.epochs: dict[int, int] = {}
        self.fresh: dict[int, int] = {}  # storage -> the epoch in which it was first seen as a fresh output buffer
        self.unwritten: dict[tuple[int, str], list[tuple[str, int, int]]] = {}
        self.edges: dict[tuple[int, int, str, str], list[tuple[str, int, int]]] = {}
        self.races: dict[tuple[int, int, str, str, str], list[tuple[str, int, int]]] = {}

    def add(self, node: CallNode) -> None:
        self.nodes[node.index] = node
        for access in node.unread.values():  # torch.empty's: never written, never read, version 0
            if access.storage is not None and access.storage not in self.versions and access.version == 0:
                self.fresh[access.storage] = 0
        for key, access in node.reads.items():
            self._seen(access, reading=True)
            self._read(node, key, access)
        for key, access in node.writes.items():
            self._seen(access, reading=False)
            self._write(node, key, access)

    def _seen(self, access: Access, reading: bool) -> None:
        """Follow the storage's version: moved before a read (not by a recorded write), a new epoch."""
        storage, version = access.storage, access.version
        if storage is None or version is None:
            return
        last = self.versions.get(storage)
        if reading and last is not None and last != version:
            self.epochs[storage] = self.epochs.get(storage, 0) + 1
        self.versions[storage] = version

    def _epoch(self, access: Access) -> int:
        return self.epochs.get(access.storage, 0) if access.storage is not None else 0

    def _read(self, node: CallNode, key: str, access: Access) -> None:
        place, epoch = access.place, self._epoch(access)
        writers = self.writers.setdefault(place.device, IntervalMap())
        written_here = []
        for start, end, (writer, writer_key, storage, written_epoch) in writers.pieces(place.start, place.end):
            if storage != access.storage or written_epoch != epoch:
                continue
            written_here.append((start, end))
            if writer == node.index:
                continue
            _add(self.edges, (writer, node.index, writer_key, key), place.device, start, end)
            if not _ordered(self.nodes[writer], node):
                _add(self.races, (writer, node.index, writer_key, key, "write then read"), place.device, start, end)
        if access.storage is not None and self.fresh.get(access.storage) == epoch:
            for start, end in _gaps(place.start, place.end, written_here):
                _add(self.unwritten, (node.index, key), place.device, start, end)
        stream = node.stream or ""
        self.readers.setdefault(place.device, IntervalMap()).update(
            place.start, place.end, lambda seen: {**(seen or {}), stream: (node.index, key, access.storage)})

    def _write(self, node: CallNode, key: str, access: Access) -> None:
        place = access.place
        writers = self.writers.setdefault(place.device, IntervalMap())
        for start, end, (writer, writer_key, storage, _) in writers.pieces(place.start, place.end):
            if writer != node.index and storage == access.storage and not _ordered(self.nodes[writer], node):
                _add(self.races, (writer, node.index, writer_key, key, "write then write"), place.device, start, end)
        readers = self.readers.setdefault(place.device, IntervalMap())
        for start, end, seen in readers.pieces(place.start, place.end):
            for reader, reader_key, storage in seen.values():
                if reader != node.index and storage == access.storage and not _ordered(self.nodes[reader], node):
                    _add(self.races, (reader, node.index, reader_key, key, "read then write"), place.device,
                         start, end)
        writers.assign(place.start, place.end, (node.index, key, access.storage, self._epoch(access)))
        readers.assign(place.start, place.end, {})


def _gaps(start: int, end: int, covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of [start, end) outside the sorted, disjoint `covered` ranges."""
    gaps, at = [], start
    for s, e in covered:
        if at < s:
            gaps.append((at, s))
        at = max(at, e)
    if at < end:
        gaps.append((at, end))
    return gaps


def _add(found: dict[Any, list[tuple[str, int, int]]], key: Any, device: str, start: int, end: int) -> None:
    """One more piece of bytes for a pair, joined to the last where they touch."""
    pieces = found.setdefault(key, [])
    if pieces and pieces[-1][2] == start:
        pieces[-1] = (device, pieces[-1][1], end)
    else:
        pieces.append((device, start, end))


def _place(pieces: list[tuple[str, int, int]]) -> Place:
    return Place(pieces[0][0], min(p[1] for p in pieces), max(p[2] for p in pieces))


def build(calls: Iterable[tuple[int, dict[str, Any]]]) -> DependencyGraph:
    """The graph of calls given as (index, description), in index order."""
    walk = _Walk()
    nodes = []
    for index, header in sorted(calls, key=lambda c: c[0]):
        node = node_of(index, header)
        nodes.append(node)
        walk.add(node)
    edges = [Edge(p, c, pk, ck, _place(pieces), tuple((s, e) for _, s, e in pieces))
             for (p, c, pk, ck), pieces in walk.edges.items()]
    races = [Race(a, b, ak, bk, kind, _place(pieces)) for (a, b, ak, bk, kind), pieces in walk.races.items()]
    unwritten = [Unwritten(reader, key, _place(pieces)) for (reader, key), pieces in walk.unwritten.items()]
    return DependencyGraph(nodes, sorted(edges, key=lambda e: (e.consumer, e.producer)),
                           sorted(races, key=lambda r: (r.second, r.first)), sorted(unwritten, key=lambda u: u.reader))


def checked(graph: DependencyGraph, path: object, *, every_call: bool) -> DependencyGraph:
    """`graph`, or a SnapshotError where it has no calls, or calls recorded without footprints
    (older recordings, other producers): any of them when `every_call` (a replay along the graph
    needs each link), all of them otherwise (nothing to draw)."""
    if not graph.nodes:
        raise SnapshotError(f"{path}: no readable calls recorded")
    missing = graph.without_footprint
    if missing and (every_call or len(missing) == len(graph.nodes)):
        raise SnapshotError(f"{path}: call {missing[0]} (and {len(missing) - 1} more) was recorded without memory "
                            "footprints (meta.memory), which link a call to its producers; record it again with this "
                            "version of kernel-replay")
    return graph


def of_snapshot(snapshot: Snapshot) -> tuple[DependencyGraph, list[str]]:
    """The graph of every readable call of `snapshot`, and what could not be read (a line each)."""
    calls, problems = [], list(snapshot.problems)
    for entry in snapshot.entries:
        try:
            calls.append((entry.index, snapshot.describe(entry)))
        except SnapshotError as exc:  # a damaged segment says so once for all its calls
            if str(exc) not in problems:
                problems.append(str(exc))
    return build(calls), problems
