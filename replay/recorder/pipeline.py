"""The far side of capture: host copies of a call's tensors become files on writer threads.

At a captured call the recorder only issues copies (copies.py). The call then goes on a bounded
queue; writer threads wait for its copies to land, hash and write blobs and chunks, and take the
calls in call order into a segment (many calls, one file) written straight from the buffers when
it closes; then the buffers go back and its calls are indexed.
When the queue is full, `when_full` says what happens: "block" (the program waits; nothing is
lost) or "drop" (the call is not recorded; drops are counted and named in the manifest's
capture_errors). A CUDA graph replay's calls travel together, as a PendingBatch: a few host
copies, and a function that describes the calls from them, run by whoever writes them. A flight
recording keeps calls and replays in a Ring instead and hands them to the writers only when asked to.
"""
from __future__ import annotations

import collections
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from replay.recorder.chunk_changes import PieceHistory, after_plan
from replay.recorder.copies import BlobRef, HostCopy, PinnedPool
from replay.recorder.flight_pieces import FlightPieces
from replay.recorder.repeats import Repeats, Site
from replay.snapshot import SnapshotWriter, hashing
from replay.snapshot.chunk_lists import ChunkList
from replay.snapshot.tensors import Geometry
from replay.snapshot.writer import CallPart, cut_bytes, host_bytes

if TYPE_CHECKING:
    import torch

WHEN_FULL = ("block", "drop")
DEFAULT_QUEUE_DEPTH = 64
WRITER_THREADS = 2  # more contend for the interpreter lock with the program (measured: docs/PERFORMANCE.md)
# A segment closes once its calls hold this many bytes, or once its first call is this old: a file
# costs ~0.3 ms to create whatever it holds, which 16 MiB written at 1.3 GB/s (~12 ms) hides; and
# a killed process loses at most the open segment and the calls not yet handed to the writers,
# calls at most about a second old
SEGMENT_BYTES = 16 << 20
SEGMENT_SECONDS = 0.5
# Calls go to the writers this many at a time (sooner when the queue is at its depth, on flush and
# close, and when a writer finds nothing for SEGMENT_SECONDS): each hand-over wakes a writer,
# which then takes the interpreter lock from the program at its next release; one wake a call cost
# a small op's recorded step 15% on the 2-core CPU (docs/PERFORMANCE.md); or once they hold this
# many bytes: a large call's hashing and writing are worth a writer now, beside the other one
HANDOFF_CALLS = 8
HANDOFF_BYTES = 1 << 20
# A host copy this small leaves its pooled pinned buffer as a writer takes its call: the open
# segment holds its calls' copies until it is written (up to SEGMENT_SECONDS), and meanwhile every
# step of the program would find no free buffer of that size and pin a new one (~40 us or more on
# the program's thread, several a step, measured on an H200: docs/PERFORMANCE.md). Larger copies
# stay: copying them again would hold the interpreter lock on the writer's side for longer.
UNPIN_BYTES = 256 << 10


@dataclass
class PendingCall:
    """A call whose copies are issued, to be written as call `index`."""
    index: int
    header: dict
    copies: dict[str, HostCopy] = field(default_factory=dict)  # stored in the call file
    blobs: dict[str, tuple[BlobRef, Geometry]] = field(default_factory=dict)  # stored once, by content
    # output buffers before the call, stored as the elements it left unchanged: key -> geometry, and
    # their keys after the call and of the mask (replay/snapshot/unwritten.py)
    befores: dict[str, tuple[Geometry, dict[str, str]]] = field(default_factory=dict)
    ready: Callable[[], None] = lambda: None
    # it writes a tensor stored in pieces: its read-only inputs may be pieces of it (put_read_only)
    writes_pieces: bool = False

    @property
    def nbytes(self) -> int:
        return sum(copy.nbytes for copy in self.copies.values())

    @property
    def count(self) -> int:
        return 1

    def calls(self) -> list["PendingCall"]:
        return [self]

    def host_copies(self) -> list[HostCopy]:
        return list(self.copies.values())


@dataclass
class PendingBatch:
    """The calls of one CUDA graph replay: their tensors came to the host in a few large copies
    (`host`), and `expand(skip)` describes the calls from the `skip`-th on, as views into them.
    Describing is left to whoever writes them (a writer thread, or a flight recording's dump), so
    that a replay costs the program a few copies, not a call's bookkeeping per call."""
    count: int
    host: list[HostCopy]
    ready: Callable[[], None]
    expand: Callable[[int], list[PendingCall]]
    skip: int = 0  # calls at the front a flight recording no longer holds
    # a flight recording's replay held in a device ring: its bytes there, and what brings them to
    # `host` when the recording is dumped (None: the slot was reused since)
    device_bytes: int = 0
    fetch: Callable[[dict[int, Any]], list[HostCopy] | None] | None = None

    @property
    def nbytes(self) -> int:
        return sum(copy.nbytes for copy in self.host) if self.host else self.device_bytes

    def bring_over(self, taken: dict[int, Any]) -> bool:
        """Its bytes on the host (False: they are gone from the device ring); `taken`: what this
        dump has read of device rings so far."""
        if self.fetch is not None:
            host = self.fetch(taken)
            if host is None:
                return False
            self.host[:], self.fetch = host, None  # the list its `expand` reads
        return True

    def calls(self) -> list[PendingCall]:
        return self.expand(self.skip)

    def host_copies(self) -> list[HostCopy]:
        return self.host


Pending = PendingCall | PendingBatch


def _lineage(site: Site) -> tuple[str, str]:
    """The stores whose chunk lists edit one another (format 6): one tensor of one op, before and
    after its call alike (a list the call left as it was is the same blob)."""
    op, key = site
    return op, key.partition("/")[2]


class Ring:
    """The flight recorder's memory: the last `calls` calls, within `max_bytes` of what they hold
    (host copies; a graph replay held in a device ring counts its slot; stores in pieces, what
    `stores` holds of them and of the stores they compare with) (the newest call or replay is kept
    even alone over the budget); older ones are forgotten as new ones come. A graph replay is held
    whole, or cut at the front when more than `calls` are held."""

    def __init__(self, calls: int, max_bytes: int, forget: Callable[[Pending], None],
                 stores: FlightPieces | None = None):
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
            raise ValueError(f"ring={calls!r}: must be a whole number of calls, at least 1")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"ring_bytes={max_bytes!r}: must be a positive number of bytes")
        self.calls, self.max_bytes, self._forget, self.stores = calls, max_bytes, forget, stores
        self._held: collections.deque[Pending] = collections.deque()
        self._sizes: collections.deque[int] = collections.deque()  # each held one's bytes but its stores'
        self._bytes = 0
        self._count = 0  # calls held
        self._lock = threading.Lock()

    def add(self, pending: Pending) -> None:
        stores = self.stores
        with self._lock:
            size = pending.nbytes if stores is None else _untracked_bytes(pending)
            self._held.append(pending)
            self._sizes.append(size)
            self._bytes += size
            self._count += pending.count
            if stores is not None:
                stores.added(pending)
            while True:
                over = self._bytes + (stores.nbytes if stores is not None else 0) > self.max_bytes
                if over and stores is not None and stores.shed():
                    continue
                if len(self._held) < 2 or not (over or self._count - self._held[0].count >= self.calls):
                    return
                oldest = self._held.popleft()
                self._bytes -= self._sizes.popleft()
                self._count -= oldest.count
                if stores is not None:
                    stores.forget(oldest)
                self._forget(oldest)

    def take(self) -> tuple[list[Pending], int, list[tuple[PieceHistory, Site]]]:
        """Everything held, oldest first, how many calls that is (at most `calls`: a replay at the
        front is cut), and the bases its stores in pieces name pieces of (FlightPieces.take);
        the ring is empty after."""
        with self._lock:
            held, self._held = list(self._held), collections.deque()
            self._sizes.clear()
            count, self._count, self._bytes = self._count, 0, 0
            bases = self.stores.take() if self.stores is not None else []
        if held and count > self.calls:
            front = held[0]
            assert isinstance(front, PendingBatch)  # only a replay holds more than one call
            front.skip += count - self.calls
            count = self.calls
        return held, count, bases


def _untracked_bytes(pending: Pending) -> int:
    """What a call's host copies hold but for its stores a FlightPieces follows (a replay: all)."""
    if isinstance(pending, PendingBatch):
        return pending.nbytes
    return sum(copy.nbytes for copy in pending.copies.values() if not (copy.chunked and copy.pieces is not None))


def check_options(depth: int, when_full: str) -> None:
    """A ValueError naming the option, before anything is created on disk."""
    if when_full not in WHEN_FULL:
        raise ValueError(f"when_full={when_full!r}: must be one of {', '.join(WHEN_FULL)}")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"queue_depth={depth!r}: must be a whole number of calls, at least 1")


@dataclass
class _Segment:
    """Calls taken in call order, to be written as one file (a segment) once closed; the pendings
    whose host copies it holds go back to the pool after."""
    opened: float = 0.0
    parts: list[CallPart] = field(default_factory=list)
    holds: list[Pending] = field(default_factory=list)
    nbytes: int = 0
    number: int = -1  # its place in the order of closing: index lines follow that order

    def add(self, parts: list[CallPart], pending: Pending) -> None:
        if not self.holds:
            self.opened = time.monotonic()
        self.parts += parts
        self.holds.append(pending)
        self.nbytes += sum(part.nbytes for part in parts)


class CallWriter:
    """Writes pending calls and indexes them in the order they were submitted: on the caller's
    thread (synchronous: a segment a call, written before the program goes on), or on `threads`
    writer threads with at most `depth` calls submitted and not yet taken into a segment (options
    checked by check_options first). Writer threads hash and write blobs and chunks side by side
    (both release the interpreter lock); calls are then taken in call order into the open segment,
    closed once it holds `segment_bytes` or its first call is `segment_seconds` old, and written
    by the thread that closed it; index lines follow in the order segments were closed."""

    def __init__(self, writer: SnapshotWriter, pool: PinnedPool, *, asynchronous: bool, depth: int,
                 when_full: str, on_error: Callable[[str, BaseException], None],
                 threads: int = WRITER_THREADS, segment_bytes: int = SEGMENT_BYTES,
                 segment_seconds: float = SEGMENT_SECONDS):
        self.writer, self.pool, self.when_full, self.on_error = writer, pool, when_full, on_error
        self.depth = depth
        self.segment_bytes = segment_bytes if asynchronous else 0
        self.segment_seconds = segment_seconds
        self.failed = False  # after a failure nothing more is indexed
        self.written = 0
        self._state = threading.Condition()
        self._submitted = 0  # sequence numbers handed out
        self._taken = 0  # the next sequence number to take into the open segment
        self._finished: dict[int, tuple[PendingCall | None, list[CallPart], BaseException | None, Pending]] = {}
        self._open = _Segment()
        self._closed = 0  # segments closed
        self._indexed = 0  # the next closed segment to index
        self._index_stopped = False  # a segment failed: none after it is indexed
        self._segments_written: dict[int, tuple[_Segment, list[dict], BaseException | None]] = {}
        self._work: queue.SimpleQueue[list[tuple[int, Pending]] | None] = queue.SimpleQueue()
        self._handoff: list[tuple[int, Pending]] = []  # submitted, not yet handed to the writers
        self._handoff_bytes = 0  # their host bytes
        self._repeats = Repeats(pool.give)  # untracked chunked stores, by site: their pieces alike the last not hashed
        self._threads = [threading.Thread(target=self._run, name=f"replay-capture-writer-{n}", daemon=True)
                         for n in range(threads if asynchronous else 0)]
        for thread in self._threads:
            thread.start()

    @property
    def threaded(self) -> bool:
        """Whether calls are written on threads of their own (until close)."""
        return bool(self._threads)

    def full(self) -> bool:
        """Whether a call made now would wait for room (when_full "drop": not recorded)."""
        return bool(self._threads) and self._submitted - self._taken >= self.depth

    def submit(self, call: Pending) -> None:
        """Queue `call` (or a replay's calls), waiting for room when `depth` are pending; written on
        this thread when synchronous, or after close (a call another thread finished meanwhile)."""
        with self._state:
            while self._threads and self._submitted - self._taken >= self.depth:
                self._hand_off()  # what waits for room must be what the writers have
                self._state.wait()
            sequence, self._submitted = self._submitted, self._submitted + 1
            queued = bool(self._threads)
            if queued:
                self._handoff.append((sequence, call))
                self._handoff_bytes += call.nbytes
                if (len(self._handoff) >= HANDOFF_CALLS or self._handoff_bytes >= HANDOFF_BYTES
                        or self._submitted - self._taken >= self.depth):
                    self._hand_off()
        if not queued:
            self._finish(sequence, call)

    def hand_off(self) -> None:
        """Give the writers the calls submitted so far now (before the program waits on them)."""
        with self._state:
            self._hand_off()

    def _hand_off(self) -> None:
        """Queue the calls submitted since the last hand-over for the writers (holding the state lock)."""
        if self._handoff:
            calls, self._handoff, self._handoff_bytes = self._handoff, [], 0
            self._work.put(calls)

    def flush(self) -> None:
        """Return once every call submitted so far is indexed (or failed): the open segment is
        closed and written."""
        with self._state:
            self._hand_off()
            target = self._submitted
            while self._taken < target:
                self._state.wait()
            closing = self._close_open()
            last = self._closed
        if closing is not None:
            self._write_segment(closing)
        with self._state:
            while self._indexed < last:
                self._state.wait()

    def close(self) -> None:
        """Write what is pending, stop the threads, and flush the files to disk."""
        with self._state:
            self._hand_off()
            threads, self._threads = self._threads, []  # from now on a call is written on its own thread
            self._state.notify_all()
        for _ in threads:
            self._work.put(None)
        for thread in threads:
            thread.join()
        try:
            self.flush()
        finally:
            self._repeats.close()
        self.writer.close()

    def _run(self) -> None:
        while True:
            try:
                item = self._work.get(timeout=self.segment_seconds)
            except queue.Empty:  # nothing new: calls not handed over yet go now; the open segment may be old
                with self._state:
                    self._hand_off()
                    closing = self._close_open() if self._open_is_old() else None
                if closing is not None:
                    self._write_segment(closing)
                continue
            if item is None:
                return
            for sequence, pending in item:
                self._finish(sequence, pending)

    def _finish(self, sequence: int, pending: Pending) -> None:
        """Make `pending`'s calls ready for a segment (blobs and chunks written), then take every
        finished call that is next in call order into the open segment, and write it if it closes."""
        parts: list[CallPart] = []
        error: BaseException | None = None
        call = pending if isinstance(pending, PendingCall) else None
        try:
            pending.ready()
            for call in pending.calls():
                if self.failed:
                    break
                parts.append(self._call_part(call))
        except Exception as exc:  # a full disk, a failed copy: reported; the program goes on
            error = exc
        failures, dropped, closing = [], [], []
        with self._state:
            self._finished[sequence] = (call, parts, error, pending)
            while self._taken in self._finished:
                done, parts, error, taken = self._finished.pop(self._taken)
                self._taken += 1
                if error is not None and not self.failed:
                    self.failed = True
                    failures.append((f"op '{done.header['op']}': writing call {done.index}" if done is not None
                                     else "writing the calls of a CUDA graph replay", error))
                    closing.append(self._close_open())  # the calls before it are whole: indexed
                if self.failed:
                    dropped.append(taken)
                    continue
                self._open.add(parts, taken)
                if self._open.nbytes >= self.segment_bytes or self._open_is_old():
                    closing.append(self._close_open())
            self._state.notify_all()
        for pending in dropped:
            self.discard(pending, landed=True)
        for what, error in failures:  # outside the lock: reporting writes the manifest
            self.on_error(what, error)
        for segment in closing:
            if segment is not None:
                self._write_segment(segment)

    def _open_is_old(self) -> bool:
        return bool(self._open.holds) and time.monotonic() - self._open.opened >= self.segment_seconds

    def _close_open(self) -> _Segment | None:
        """The open segment, numbered in the order of closing, and a new one open; None if it is
        empty. Called holding the state lock."""
        if not self._open.holds:
            return None
        closing, self._open = self._open, _Segment()
        closing.number, self._closed = self._closed, self._closed + 1
        return closing

    def _write_segment(self, segment: _Segment) -> None:
        """Write a closed segment's file, give its host copies back, and index its calls once every
        segment closed before it is indexed."""
        lines: list[dict] = []
        error: BaseException | None = None
        try:
            if segment.parts:
                lines = self.writer.write_segment(segment.parts)
        except Exception as exc:
            error = exc
        for pending in segment.holds:
            self.discard(pending, landed=True)
        failures = []
        with self._state:
            self._segments_written[segment.number] = (segment, lines, error)
            while self._indexed in self._segments_written:
                done, lines, error = self._segments_written.pop(self._indexed)
                self._indexed += 1
                failed_at = None  # the call whose index line could not be appended
                for line in lines if error is None and not self._index_stopped else []:
                    try:
                        self.writer.add_to_index(line)
                        self.written += 1
                    except OSError as exc:  # the calls after it in the segment are written but never indexed
                        error, failed_at = exc, line["index"]
                        break
                if error is not None and not self._index_stopped:
                    self._index_stopped = self.failed = True
                    first, last = (failed_at, failed_at) if failed_at is not None else \
                        (done.parts[0].index, done.parts[-1].index)
                    failures.append((f"writing call {first}" if first == last else f"writing calls {first}-{last}",
                                     error))
            self._state.notify_all()
        for what, error in failures:  # outside the lock: reporting writes the manifest
            self.on_error(what, error)

    def _call_part(self, call: PendingCall) -> CallPart:
        """A call's blobs and chunks written (its copies have landed), the rest made ready for a segment."""
        chunks: dict[str, ChunkList] = {}
        blobs: dict[str, str] = {}
        try:
            for key, (ref, _) in call.blobs.items():
                stored = ref.resolve(self.writer, self.release, self.pool, call.writes_pieces,
                                     _lineage((call.header["op"], key)))
                if isinstance(stored, ChunkList):  # a row of what the call writes, in pieces
                    chunks[key] = stored
                else:
                    blobs[key] = stored
            for key, copy in call.copies.items():
                if copy.chunked:
                    chunks[key] = self._put_chunks(copy, (call.header["op"], key))
                    self.release(copy)  # not held until the segment is written: a cache's copy is large
                elif copy.buffer is not None and copy.nbytes <= UNPIN_BYTES:
                    self.pool.give(copy.unpin())
        except BaseException:  # a later store of the same memory waits for these: never in vain
            for copy in call.copies.values():
                if copy.pieces is not None:
                    copy.pieces.hashed(None)
            raise
        geometries = {**{key: geometry for key, (geometry, _) in call.befores.items()},
                      **{key: copy.geometry for key, copy in call.copies.items()},
                      **{key: geometry for key, (_, geometry) in call.blobs.items()}}
        return self.writer.call_part(call.index, call.header,
                                     {key: c.span for key, c in call.copies.items() if not c.chunked},
                                     geometries, blobs, chunks, {key: made for key, (_, made) in call.befores.items()})

    def _put_chunks(self, copy: HostCopy, site: Site) -> ChunkList:
        """Store a chunked copy's pieces, hashing only those changed since its memory's last store
        (those alone come over from the device where they wait there), none where the recording
        stored the same bytes before; its list, as edits of the last whole list of its `site` where
        few pieces changed. An untracked copy's pieces alike the last untracked store of its
        `site` are not hashed either (repeats.py)."""
        lineage = _lineage(site)
        history = copy.pieces
        if history is None:
            raw = host_bytes(copy.span)
            listed, digests = self.writer.put_pieces(cut_bytes(raw), self._repeats.known(site, raw), lineage)
            self._repeats.keep(site, copy, raw, digests)
            return listed
        return self._put_tracked(history, lineage, None if copy.on_device or history.held is not None else copy.span)

    def put_base(self, history: PieceHistory, site: Site) -> None:
        """A flight recording's base (flight_pieces.py): its pieces stored, for the stores a dump
        writes after it to name (a failure fails those stores, which say so)."""
        try:
            self._put_tracked(history, _lineage(site), None)
        except Exception:
            history.hashed(None)

    def _put_tracked(self, history: PieceHistory, lineage: tuple[str, str], span: torch.Tensor | None) -> ChunkList:
        """Store a tracked store's pieces: from where they wait (the device, or the host pieces a
        flight recording held), or from `span`, the tensor on the host whole."""
        same = history.stored_before()
        if same is not None:
            history.hashed(*same, new=[])  # nothing comes over: its staged pieces are let go
            return same[1]
        buffer = None
        if span is None:
            pieces, known, buffer = history.fetch(history.known(), self.pool.take)
        else:  # on the host whole: pieces known by checksums, or alike, are not hashed
            pieces = cut_bytes(host_bytes(span))
            before = history.known()
            resolved, alike, _, _ = history.plan(before)  # the pieces are all here
            for n, first in alike.items():
                pieces[n] = pieces[first]
            known = after_plan(before, resolved, alike)
        try:
            listed, digests = self.writer.put_pieces(pieces, known, lineage)
        finally:
            if buffer is not None:
                self.pool.give(buffer)
        history.hashed(digests, listed, new=known.unknown)
        return listed

    def discard(self, pending: Pending, landed: bool = False) -> None:
        """Give back the buffers of a call (or replay) written or never to be, once its copies landed."""
        if not landed:
            pending.ready()
        for copy in pending.host_copies():
            self.release(copy)

    def release(self, copy: HostCopy) -> None:
        if copy.pieces is not None:  # never written (a flight recording forgot it): a later store hashes all
            copy.pieces.hashed(None)
            # and let go: the open segment holds the copy until written, its checksums (device and
            # pinned memory) would wait with it while every step takes new ones
            copy.pieces = None
        if copy.buffer is not None:
            self.pool.give(copy.buffer)
            copy.buffer = None
