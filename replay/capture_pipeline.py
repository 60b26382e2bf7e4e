"""The far side of capture: host copies of a call's tensors become files on a writer thread.

At a captured call the recorder only issues copies: a CPU tensor is cloned; a GPU tensor's
storage span is copied `non_blocking` into a pinned host buffer from a reusable pool, on the
stream the call runs on (inputs before the call, outputs after), and an event marks the end.
The call then goes on a bounded queue; the writer thread waits for the event, hashes blobs,
serialises and writes, and gives the buffers back. When the queue is full, `when_full` says
what happens: "block" (the program waits; nothing is lost) or "drop" (the call is not
recorded; drops are counted and named in the manifest's capture_errors). A flight recording
keeps its calls in a Ring instead and hands them to the writer only when asked to.
"""
from __future__ import annotations

import collections
import queue
import threading
from dataclasses import dataclass, field
from typing import Callable

import torch

from replay.snapshot import SnapshotWriter
from replay.snapshot.tensors import Geometry, geometry_of, storage_span

WHEN_FULL = ("block", "drop")
DEFAULT_QUEUE_DEPTH = 64
_MIN_BUFFER = 4096


class PinnedPool:
    """Page-locked host buffers by power-of-two size, reused once the writer is done with them
    (allocating pinned memory costs far more than a copy into it); up to `max_free_bytes` wait
    for reuse, from one recording to the next."""

    def __init__(self, max_free_bytes: int = 1 << 30) -> None:
        self.max_free_bytes = max_free_bytes
        self._free: dict[int, list[torch.Tensor]] = {}
        self._free_bytes = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        size = max(_MIN_BUFFER, 1 << (max(nbytes, 1) - 1).bit_length())
        with self._lock:
            free = self._free.get(size)
            if free:
                self._free_bytes -= size
                return free.pop()
        return torch.empty(size, dtype=torch.uint8, pin_memory=True)

    def give(self, buffer: torch.Tensor) -> None:
        with self._lock:
            if self._free_bytes + buffer.numel() <= self.max_free_bytes:  # else it is freed
                self._free.setdefault(buffer.numel(), []).append(buffer)
                self._free_bytes += buffer.numel()


SHARED_POOL = PinnedPool()


@dataclass
class HostCopy:
    """A tensor's storage span on the host, or on its way there."""
    span: torch.Tensor
    geometry: Geometry
    buffer: torch.Tensor | None = None  # the pooled pinned buffer `span` lives in, to give back
    chunked: bool = False  # stored as content-addressed pieces (a large tensor that changes)
    landed: torch.cuda.Event | None = None  # where a copy is read by other calls than its own

    @property
    def nbytes(self) -> int:
        return self.span.numel() * self.span.element_size()


class BlobRef:
    """A read-only tensor stored once, by content: its digest is known once a writer has hashed
    the one copy taken of it; every later call that passes it again refers to it."""

    def __init__(self, copy: HostCopy):
        self.copy: HostCopy | None = copy
        self.digest: str | None = None
        self._lock = threading.Lock()

    def resolve(self, writer: SnapshotWriter, release: Callable[[HostCopy], None]) -> str:
        with self._lock:
            if self.digest is None:
                if self.copy is None:
                    raise OSError("the blob's copy was lost with an earlier failed call")
                copy, self.copy = self.copy, None
                try:
                    if copy.landed is not None:  # another call's copy: its own call's events do not cover it
                        copy.landed.synchronize()
                    self.digest = writer.put_blob(copy.span)
                finally:
                    release(copy)
            return self.digest


class Copier:
    """Takes host copies of tensors, stream-ordered on a GPU, and remembers what must be waited
    for before they can be read."""

    def __init__(self, pool: PinnedPool):
        self.pool = pool
        self._devices: set[torch.device] = set()

    def copy(self, t: torch.Tensor, landed: bool = False) -> HostCopy:
        """A host copy of `t`'s storage span; with `landed`, one that carries an event of its own
        (a blob: other calls, on other streams, may be written before the one that took it)."""
        geometry = geometry_of(t)
        span = storage_span(t.detach(), geometry)
        if span.device.type != "cuda":
            return HostCopy(span.to("cpu", copy=True) if span.device.type != "cpu" else span.clone(), geometry)
        nbytes = span.numel() * span.element_size()
        buffer = self.pool.take(nbytes)
        host = buffer[:nbytes].view(span.dtype)
        host.copy_(span, non_blocking=True)
        self._devices.add(span.device)
        event = None
        if landed:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(span.device))
        return HostCopy(host, geometry, buffer, landed=event)

    def mark(self) -> Callable[[], None]:
        """After the last copy of a call: a function that waits until every copy has landed."""
        events = []
        for device in self._devices:
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(device))
            events.append(event)
        self._devices = set()

        def landed() -> None:
            for event in events:
                event.synchronize()
        return landed


@dataclass
class PendingCall:
    """A call whose copies are issued, to be written as call `index`."""
    index: int
    header: dict
    copies: dict[str, HostCopy] = field(default_factory=dict)  # stored in the call file
    blobs: dict[str, tuple[BlobRef, Geometry]] = field(default_factory=dict)  # stored once, by content
    ready: Callable[[], None] = lambda: None

    @property
    def nbytes(self) -> int:
        return sum(copy.nbytes for copy in self.copies.values())


class Ring:
    """The flight recorder's memory: the last `calls` calls, within `max_bytes` of host copies
    (the newest is kept even alone over the budget); older ones are forgotten as new ones come."""

    def __init__(self, calls: int, max_bytes: int, forget: Callable[[PendingCall], None]):
        if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
            raise ValueError(f"ring={calls!r}: must be a whole number of calls, at least 1")
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"ring_bytes={max_bytes!r}: must be a positive number of bytes")
        self.calls, self.max_bytes, self._forget = calls, max_bytes, forget
        self._held: collections.deque[PendingCall] = collections.deque()
        self._bytes = 0
        self._lock = threading.Lock()

    def add(self, call: PendingCall) -> None:
        with self._lock:
            self._held.append(call)
            self._bytes += call.nbytes
            while len(self._held) > self.calls or (self._bytes > self.max_bytes and len(self._held) > 1):
                oldest = self._held.popleft()
                self._bytes -= oldest.nbytes
                self._forget(oldest)

    def take(self) -> list[PendingCall]:
        """Every call held, oldest first; the ring is empty after."""
        with self._lock:
            held, self._held, self._bytes = list(self._held), collections.deque(), 0
        return held


def check_options(depth: int, when_full: str) -> None:
    """A ValueError naming the option, before anything is created on disk."""
    if when_full not in WHEN_FULL:
        raise ValueError(f"when_full={when_full!r}: must be one of {', '.join(WHEN_FULL)}")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"queue_depth={depth!r}: must be a whole number of calls, at least 1")


class CallWriter:
    """Writes pending calls in the order they come, on the caller's thread (synchronous) or on a
    thread of its own behind a queue of `depth` calls (options checked by check_options first)."""

    def __init__(self, writer: SnapshotWriter, pool: PinnedPool, *, asynchronous: bool, depth: int,
                 when_full: str, on_error: Callable[[PendingCall, BaseException], None]):
        self.writer, self.pool, self.when_full, self.on_error = writer, pool, when_full, on_error
        self.failed = False  # after a failure nothing more is written
        self.written = 0
        self._queue: queue.Queue[PendingCall | None] | None = None
        self._thread: threading.Thread | None = None
        if asynchronous:
            self._queue = queue.Queue(maxsize=depth)
            self._thread = threading.Thread(target=self._run, args=(self._queue,), name="replay-capture-writer",
                                            daemon=True)
            self._thread.start()

    def full(self) -> bool:
        """Whether a call made now would wait for room (when_full "drop": not recorded)."""
        queued = self._queue
        return queued is not None and queued.full()

    def submit(self, call: PendingCall) -> None:
        """Write `call` now (synchronous, or after close: a call another thread finished meanwhile)
        or queue it, waiting for room when the queue is full."""
        queued = self._queue
        if queued is None:
            self._write(call)
        else:
            queued.put(call)

    def flush(self) -> None:
        """Return once every call submitted so far is written (or failed)."""
        queued = self._queue
        if queued is not None:
            queued.join()

    def close(self) -> None:
        """Write what is queued, stop the thread, and flush the files to disk."""
        queued = self._queue
        if queued is not None and self._thread is not None:
            self._queue = None  # from now on a call is written on its own thread
            queued.put(None)
            self._thread.join()
            while not queued.empty():  # put behind the stop marker by a call that raced close
                call = queued.get_nowait()
                if call is not None:
                    self._write(call)
        self.writer.close()

    def _run(self, queued: queue.Queue[PendingCall | None]) -> None:
        while True:
            call = queued.get()
            try:
                if call is None:
                    return
                self._write(call)
            finally:
                queued.task_done()

    def _write(self, call: PendingCall) -> None:
        try:
            call.ready()
            if self.failed:
                return
            blobs = {key: ref.resolve(self.writer, self.release) for key, (ref, _) in call.blobs.items()}
            chunks = {key: self.writer.put_chunks(c.span) for key, c in call.copies.items() if c.chunked}
            geometries = {**{key: copy.geometry for key, copy in call.copies.items()},
                          **{key: geometry for key, (_, geometry) in call.blobs.items()}}
            self.writer.write_call(call.index, call.header,
                                   {key: c.span for key, c in call.copies.items() if not c.chunked},
                                   geometries, blobs, chunks)
            self.written += 1
        except Exception as exc:  # a full disk, a failed copy: reported; the program goes on
            self.failed = True
            self.on_error(call, exc)
        finally:
            for copy in call.copies.values():
                self.release(copy)

    def release(self, copy: HostCopy) -> None:
        if copy.buffer is not None:
            self.pool.give(copy.buffer)
            copy.buffer = None
