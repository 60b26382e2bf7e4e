"""The near side of capture: host copies of a call's tensors, taken where the program runs.

A CPU tensor is cloned; a GPU tensor's storage span is copied into a pinned host buffer from a
reusable pool, on the stream the call runs on (inputs before the call, outputs after), and an
event marks the end, which the writers wait for before they read the copy. Both are queued through
the CUDA runtime itself where it can be (cuda_runtime.py), from the tensor's address: no torch
operator, which would wait for the interpreter lock beside the writers; the host tensor over the
buffer is made when a writer first reads it. A large GPU tensor stored in pieces or as a blob may
instead wait on the device, checksummed, for a writer to bring over what the recording has not
stored yet (chunk_changes.py).
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Callable, Hashable

import torch

from replay.recorder import cuda_runtime, cuda_streams
from replay.recorder import unchanged_bits
from replay.recorder.chunk_changes import PieceHistory, PieceTracker
from replay.recorder.device_buffers import UNKEPT, DeviceBuffers, nothing
from replay.recorder.piece_batch import PieceBatch
from replay.snapshot import SnapshotWriter, unwritten
from replay.snapshot.chunk_lists import ChunkList
from replay.snapshot.tensors import DTYPES, Geometry, geometry_of, storage_span

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
        return torch.empty(size, dtype=torch.uint8, pin_memory=torch.cuda.is_available())  # where a GPU copies in

    def give(self, buffer: torch.Tensor) -> None:
        with self._lock:
            if self._free_bytes + buffer.numel() <= self.max_free_bytes:  # else it is freed
                self._free.setdefault(buffer.numel(), []).append(buffer)
                self._free_bytes += buffer.numel()


SHARED_POOL = PinnedPool()


@dataclass
class HostCopy:
    """A tensor's storage span on the host, or on its way there."""
    made: torch.Tensor | None  # the span on the host; None: the start of `buffer`, made into one when read
    geometry: Geometry  # whose span (elements, dtype) the copy holds
    buffer: torch.Tensor | None = None  # the pooled pinned buffer the span lives in, to give back
    chunked: bool = False  # stored as content-addressed pieces (a large tensor that changes)
    pieces: PieceHistory | None = None  # which pieces changed since the last store of its memory
    # where a copy is read by other calls than its own: an event, or checksums' launch
    landed: cuda_streams.Landing | None = None
    on_device: bool = False  # its changed pieces (a blob's: all) wait on the device (pieces.staged); `span` empty
    # `made` is memory of its own (a clone), no view into a buffer something else gives back (a graph
    # replay's slab): a writer may keep it past the call (repeats.py)
    own_memory: bool = False

    @property
    def span(self) -> torch.Tensor:
        """The copy as a 1-D host tensor of its dtype (read once it has landed)."""
        if self.made is None:
            assert self.buffer is not None, "a host copy read after its buffer went back"
            dtype = DTYPES[self.geometry.dtype]
            self.made = self.buffer[:self.geometry.span * dtype.itemsize].view(dtype)
        return self.made

    def unpin(self) -> torch.Tensor:
        """Move the span (landed) out of its pooled pinned buffer into memory of its own; the
        buffer, for the caller to give back."""
        buffer = self.buffer
        assert buffer is not None, "a host copy unpinned twice"
        dtype, nbytes = DTYPES[self.geometry.dtype], self.nbytes
        # numpy's copy, not a torch operator: a writer's operator lets go of the lock and waits for it again
        self.made = torch.from_numpy(buffer[:nbytes].numpy().copy()).view(dtype) if nbytes else _no_bytes(dtype)
        self.buffer = None
        return buffer

    @property
    def nbytes(self) -> int:
        if self.on_device:
            assert self.pieces is not None
            return self.pieces.nbytes
        if self.made is None:
            return self.geometry.span * DTYPES[self.geometry.dtype].itemsize
        return self.made.numel() * self.made.element_size()


@dataclass
class HeldBefore:
    """An output buffer's span as it was before its call, copied on its device."""
    span: torch.Tensor  # of the buffer's dtype, or its bytes (uint8: a kept buffer the runtime copied into)
    geometry: Geometry
    address: int  # where the span was: a call that moved the buffer (resized it) wrote it elsewhere
    give: Callable[[], None] = nothing  # gives a kept buffer back, once every read of it is queued


class BlobRef:
    """A read-only tensor stored once, by content: its digest is known once a writer has hashed
    the one copy taken of it (or, for one that waits on the device, found its checksums among the
    blobs the recording stored); every later call that passes it again refers to it."""

    def __init__(self, copy: HostCopy):
        self.copy: HostCopy | None = copy
        self.digest: str | ChunkList | None = None  # a blob's digest, or a small one's chunk list
        self.failure: Exception | None = None  # why writing it failed: every call that refers to it says so
        self._lock = threading.Lock()

    def resolve(self, writer: SnapshotWriter, release: Callable[[HostCopy], None], pool: PinnedPool,
                pieced: bool = False, lineage: Hashable | None = None) -> str | ChunkList:
        """Its digest (or chunk list: put_read_only's `pieced` and `lineage`), stored by the first call to ask."""
        with self._lock:
            if self.failure is not None:
                raise self.failure
            if self.digest is None:
                assert self.copy is not None
                copy, self.copy = self.copy, None
                try:
                    if copy.landed is not None:  # another call's copy: its own call's events do not cover it
                        copy.landed.synchronize()
                    self.digest = (_put_from_device(copy, writer, pool, pieced, lineage) if copy.on_device
                                   else writer.put_read_only(copy.span, pieced, lineage))
                except Exception as exc:
                    self.failure = exc
                    raise
                finally:
                    release(copy)
            return self.digest

    def let_go(self, release: Callable[[HostCopy], None]) -> None:
        """The recording is over: give back the copy if no call took it."""
        with self._lock:
            copy, self.copy = self.copy, None
        if copy is not None:
            if copy.landed is not None:
                with contextlib.suppress(Exception):  # a launch that failed: said by the calls that met it
                    copy.landed.synchronize()
            release(copy)


def _put_from_device(copy: HostCopy, writer: SnapshotWriter, pool: PinnedPool, pieced: bool,
                     lineage: Hashable | None) -> str | ChunkList:
    """The digest of a blob waiting on the device: a blob the recording stored with the same
    checksums, or else the staged bytes brought over and stored."""
    history = copy.pieces
    assert history is not None
    key = (history.content_key(), str(copy.span.dtype))
    digest = history.recorded.blobs.get(key)
    if digest is None:
        host, buffer = history.whole(pool.take)
        try:
            digest = writer.put_read_only(torch.from_numpy(host).view(copy.span.dtype), pieced, lineage)
        finally:
            if buffer is not None:
                pool.give(buffer)
        history.recorded.remember_blob(key, digest)
    return digest


_EMPTY: dict[torch.dtype, torch.Tensor] = {}


def _no_bytes(dtype: torch.dtype) -> torch.Tensor:
    """An empty host tensor of `dtype`: the span of a copy whose bytes wait on the device (one a
    dtype, shared and never written: a new one a store cost ~10 us)."""
    empty = _EMPTY.get(dtype)
    if empty is None:
        empty = _EMPTY[dtype] = torch.empty(0, dtype=dtype)
    return empty


def _nothing_to_wait_for() -> None:
    """What a copier that made no copy waits for."""


def piece_batch(device: torch.device, pool: PinnedPool, buffers: DeviceBuffers = UNKEPT) -> PieceBatch:
    """A batch of tracked stores on `device`, its table and checksums in host memory the device
    reaches in place (the pool's pinned buffers on a GPU, plain tensors for Triton's interpreter),
    the checksums later stores compare with in `buffers`' device memory."""
    def on_device(nbytes: int) -> tuple[torch.Tensor, Callable[[], None]]:
        return buffers.take(nbytes, device)
    if device.type == "cuda":
        return PieceBatch(device, pool.take, pool.give, on_device)
    return PieceBatch(device, lambda nbytes: torch.empty(nbytes, dtype=torch.uint8), lambda buffer: None, on_device)


class Copier:
    """Takes host copies of tensors, stream-ordered on a GPU, and remembers what must be waited
    for before they can be read. `before_call`: the copies are a call's inputs, taken before it
    runs (call_begins() says when it does); else they are taken after the work they follow."""

    def __init__(self, pool: PinnedPool, before_call: bool = False, buffers: DeviceBuffers = UNKEPT):
        self.pool = pool
        self.buffers = buffers  # device memory for what stays on the device a while (the recording's, kept)
        self._before_call = before_call
        self._devices: set[torch.device] = set()
        self._tracker: PieceTracker | None = None  # the recording's, once a store of this call is staged
        self._batches: dict[torch.device, PieceBatch] = {}  # tracked stores waiting for their checksums' launch
        self._staged = 0  # device bytes staged for this copier's call
        self._before: dict[str, HeldBefore] = {}  # output buffers as they were, over the call

    def copy(self, t: torch.Tensor, landed: bool = False, geometry: Geometry | None = None) -> HostCopy:
        """A host copy of `t`'s storage span (`geometry`: `t`'s, where the caller has it already);
        with `landed`, one that carries an event of its own (a blob: other calls, on other
        streams, may be written before the one that took it)."""
        geometry = geometry or geometry_of(t)
        runtime = cuda_runtime.on_current_device(t.device)
        if runtime is not None:  # its span starts at its first element: no view to make
            return self._copy_through(runtime, t.data_ptr(), t.device, geometry, landed)
        return self.copy_span(storage_span(t, geometry), geometry, landed)

    def copy_span(self, span: torch.Tensor, geometry: Geometry, landed: bool = False) -> HostCopy:
        """A host copy of a storage span taken already (copy() says the rest)."""
        runtime = cuda_runtime.on_current_device(span.device)
        if runtime is not None:
            return self._copy_through(runtime, span.data_ptr(), span.device, geometry, landed)
        if span.device.type != "cuda":
            return HostCopy(span.to("cpu", copy=True) if span.device.type != "cpu" else span.clone(), geometry,
                            own_memory=True)
        nbytes = span.numel() * span.element_size()
        buffer = self.pool.take(nbytes)
        host = buffer[:nbytes].view(span.dtype)
        host.copy_(span, non_blocking=True)
        self._devices.add(span.device)
        return HostCopy(host, geometry, buffer, landed=cuda_streams.event_now(span.device) if landed else None)

    def _copy_through(self, runtime: cuda_runtime.Runtime | cuda_runtime.HostRuntime, address: int,
                      device: torch.device, geometry: Geometry, landed: bool) -> HostCopy:
        """copy_span()'s copy queued through the CUDA runtime from the span's device address."""
        nbytes = geometry.span * DTYPES[geometry.dtype].itemsize
        buffer = self.pool.take(nbytes)
        stream = runtime.current_stream(device.index)
        runtime.copy_to_host(buffer.data_ptr(), address, nbytes, stream)
        self._devices.add(device)
        try:
            event = runtime.event(stream) if landed else None
        except RuntimeError:  # the buffer goes back to torch now: no copy may still be writing into it
            with contextlib.suppress(RuntimeError):
                runtime.synchronize(stream)
            raise
        return HostCopy(None, geometry, buffer, landed=event)

    def copy_blob(self, t: torch.Tensor, tracker: PieceTracker | None, geometry: Geometry | None = None) -> HostCopy:
        """A copy of a read-only tensor to be stored as a blob, carrying an event of its own (other
        calls, on other streams, may be written before the one that took it): where `tracker`
        follows its device and there is room, checksummed and kept on the device, to come over
        only if the recording never stored those bytes; else a host copy, as copy() takes."""
        geometry = geometry or geometry_of(t)
        pieces = None
        if tracker is not None:
            pieces = tracker.observe_blob(t, self._batch(t.device), self._before_call, geometry)
        if tracker is None or pieces is None:
            return self.copy(t, landed=True, geometry=geometry)
        self._note_staged(tracker, pieces)  # before anything else may raise: the call's mark() counts it
        return HostCopy(_no_bytes(t.dtype), geometry, pieces=pieces, landed=pieces.place.checksums, on_device=True)

    def copy_chunked(self, t: torch.Tensor, tracker: PieceTracker, geometry: Geometry | None = None) -> HostCopy:
        """A copy of a large tensor the program changes in place, to be stored in pieces: where
        `tracker` follows its device, the pieces changed since its last store are flagged and
        copied there, for a writer (or a flight recording's ring) to bring over later; else, or
        where there is no room to stage them, the whole span comes to the host now, as copy() does."""
        geometry = geometry or geometry_of(t)
        pieces = tracker.observe(t, True, self._batch(t.device), self._before_call, geometry)
        if pieces is not None and pieces.staged is not None:
            self._note_staged(tracker, pieces)
            if t.is_cuda:
                self._devices.add(t.device)  # the call's event then covers the kernel and its flags
            return HostCopy(_no_bytes(t.dtype), geometry, chunked=True, pieces=pieces, on_device=True)
        try:
            copy = self.copy(t, geometry=geometry)
        except BaseException:
            if pieces is not None:
                pieces.hashed(None)  # never to be written: a later store of its memory compares with nothing
            raise
        copy.chunked, copy.pieces = True, pieces
        return copy

    def hold_before(self, key: str, t: torch.Tensor, geometry: Geometry) -> bool:
        """Keep a copy of an output buffer's span on its device over its call, to tell after it
        which elements the call left unchanged (before()); False where the device has no room."""
        try:
            self._before[key] = self._copy_on_device(t, geometry)
        except torch.cuda.OutOfMemoryError:  # the program's memory comes first: its bytes are stored instead
            return False
        return True

    def _copy_on_device(self, t: torch.Tensor, geometry: Geometry) -> HeldBefore:
        """A copy of `t`'s storage span beside it on its device: through the CUDA runtime into a
        kept buffer where it can (from `t`'s address: no view to make, no torch operator), else a clone."""
        runtime = cuda_runtime.on_current_device(t.device)
        if runtime is None:
            return HeldBefore(storage_span(t, geometry).clone(), geometry, t.data_ptr())
        nbytes = geometry.span * t.element_size()
        copy, give = self.buffers.take(nbytes, t.device)
        runtime.copy_on_device(copy.data_ptr(), t.data_ptr(), nbytes, runtime.current_stream(t.device.index))
        return HeldBefore(copy, geometry, t.data_ptr(), give)

    def before(self, key: str) -> HeldBefore | None:
        """The copy hold_before() kept of `key`, let go of here."""
        return self._before.pop(key, None)

    def copy_unchanged(self, held: HeldBefore, t: torch.Tensor, geometry: Geometry) -> HostCopy | None:
        """A host copy of the mask of the elements of `t`'s span (`geometry`: t's) its call left as
        `held` has them (replay/snapshot/unwritten.py), made on its device; None where the call
        moved or resized `t`, or the device has no room for the mask (copy_held() then)."""
        if held.geometry != geometry or held.address != t.data_ptr():
            return None
        try:
            mask, give_mask = self.buffers.take(unwritten.mask_bytes(geometry.span), t.device)
            mask = unchanged_bits.unchanged_mask(held.span, t, geometry.span, mask)
        except torch.cuda.OutOfMemoryError:
            return None
        try:
            return self.copy_span(mask, geometry_of(mask))
        finally:  # what reads them is queued on their stream
            give_mask()
            held.give()

    def copy_held(self, held: HeldBefore) -> HostCopy:
        """A host copy of the bytes hold_before() kept."""
        span = held.span
        if cuda_runtime.on_current_device(span.device) is None and span.dtype != DTYPES[held.geometry.dtype]:
            span = span.view(DTYPES[held.geometry.dtype])  # torch's copy makes a host tensor of its dtype
        try:
            return self.copy_span(span, held.geometry)
        finally:
            held.give()

    def _batch(self, device: torch.device) -> PieceBatch:
        batch = self._batches.get(device)
        if batch is None:
            batch = self._batches[device] = piece_batch(device, self.pool, self.buffers)
        return batch

    def call_begins(self) -> None:
        """The call's inputs are taken and it runs next: the checksums of stores that read the
        program's memory (no room to copy it aside) are launched now, as the call may change it;
        the others wait for mark()'s launch."""
        for batch in self._batches.values():
            batch.flush_live()
        self._before_call = False

    def flush(self) -> None:
        """Launch the checksums of the tracked stores made since the last flush, on every device
        (one that fails tells its stores' readers so, and does not keep the others from launching):
        the first failure is raised. Their readers wait for mark(), which records the event after them."""
        failure: BaseException | None = None
        for batch in self._batches.values():
            try:
                batch.launch()
            except BaseException as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def _land(self) -> dict[torch.device, cuda_streams.Landing]:
        """Tell each batch's checksums the event after them, which is the call's own on that device
        (one event a device a call): a batch that cannot have one has its checksums failed, not
        waited for. The events, by device."""
        events: dict[torch.device, cuda_streams.Landing] = {}
        for device, batch in self._batches.items():
            if device.type != "cuda":
                batch.landed(None)
                continue
            try:
                events[device] = cuda_streams.event_now(device)
            except Exception as exc:  # a broken device: its readers are told; the call's own event says it again
                batch.failed(exc)
                continue
            batch.landed(events[device])
        return events

    def _count_handed_over(self) -> None:
        """The call's staged stores go to the writers (or are dropped): no longer in the making."""
        if self._tracker is not None and self._staged:
            self._tracker.handed_over(self._staged)
        self._staged = 0
        self._before.clear()  # a call abandoned before its outputs: the buffers' copies go

    def _note_staged(self, tracker: PieceTracker, pieces: PieceHistory) -> None:
        assert pieces.staged is not None
        self._tracker = tracker
        self._staged += pieces.staged.numel()  # bytes

    def mark(self) -> Callable[[], None]:
        """After the last copy of a call, as it goes to the writers (or is dropped): a function that
        waits until every copy has landed."""
        if not (self._batches or self._devices or self._staged or self._before):
            return _nothing_to_wait_for  # no copy made (a flight recording's replay held on the device)
        try:
            with contextlib.suppress(Exception):  # never the program's error: the stores' checksums carry it
                self.flush()
        finally:
            self._count_handed_over()
            recorded = self._land()
        events = [recorded.get(device) or cuda_streams.event_now(device) for device in self._devices]
        self._devices = set()

        def landed() -> None:
            for event in events:
                event.synchronize()
        return landed
