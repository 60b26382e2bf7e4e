"""A recording into one snapshot: each call's tensors copied as it runs, handed to the writers.

While a recording is active, a recorded call's inputs are copied before it runs (so an in-place
kernel still replays from its true inputs), its outputs and mutated arguments after, with any
tags and launch records the call made (replay/recorder/staging.py walks the call; the copies are
issued here, replay/recorder/pipeline.py writes them on threads of their own). A call captured
into a CUDA graph is recorded at each replay of the graph (replay/recorder/graph_recording.py).
Capture never crashes the program it records unless `strict`: failures are reported once on
stderr and in the manifest.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import logging
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Callable

import torch

from replay import settings
from replay.recorder import graphs, staging, stream_order
from replay.recorder.chunk_changes import PieceTracker
from replay.recorder.flight_pieces import FlightPieces
from replay.recorder.footprint import Footprint, StorageIds
from replay.recorder.stream_order import StreamClocks
from replay.recorder.graph_recording import GraphRecording
from replay.recorder.options import RecordingOptions
from replay.recorder.copies import SHARED_POOL, BlobRef, Copier
from replay.recorder.pipeline import CallWriter, PendingBatch, PendingCall, Ring
from replay.context import collecting
from replay.errors import CaptureError
from replay.settings import SettingError
from replay.snapshot import SnapshotWriter
from replay.snapshot.tensors import Geometry
from replay.snapshot.writer import MANIFEST

CHUNKED_STORAGES = 4096  # storages remembered as stored in chunks (a model's KV caches, a layer each)

log = logging.getLogger(__name__)


class _BlobIds:
    """Remembers which blob holds an unchanged tensor so weights are copied and hashed once.

    The key includes the version counter, so a weight modified in place is stored
    again. Inference-mode tensors have no version counter: they are hashed each call
    (content addressing still writes them once).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids: dict[tuple, tuple[weakref.ref, BlobRef]] = {}

    @staticmethod
    def _key(t: torch.Tensor) -> tuple[tuple, torch.Tensor] | None:
        if t.is_inference():
            return None
        base = t._base if t._base is not None else t
        key = (id(base), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype, str(t.device), t._version)
        return key, base

    def get(self, t: torch.Tensor) -> BlobRef | None:
        keyed = self._key(t)
        if keyed is None:
            return None
        key, base = keyed
        with self._lock:
            hit = self._ids.get(key)
        return hit[1] if hit is not None and hit[0]() is base else None

    def refs(self) -> list[BlobRef]:
        with self._lock:
            return [blob for _, blob in self._ids.values()]

    def put(self, t: torch.Tensor, blob: BlobRef) -> None:
        keyed = self._key(t)
        if keyed is None:
            return
        key, base = keyed
        # Drop the entry when the tensor dies, so a long recording does not accumulate them.
        alive = weakref.ref(base, functools.partial(self._forget, key))
        with self._lock:
            self._ids[key] = (alive, blob)

    def _forget(self, key: tuple, dead: weakref.ref) -> None:
        # Runs from the garbage collector, possibly while this thread holds the lock:
        # a single dict operation under the GIL needs no lock.
        if self._ids.get(key, (None,))[0] is dead:
            self._ids.pop(key, None)


class Recording(GraphRecording):
    """An active recording into one snapshot directory."""

    def __init__(self, path: str | Path, options: RecordingOptions = RecordingOptions()):
        self.options = options
        self.strict = options.strict if options.strict is not None else settings.CAPTURE_STRICT.get()
        self.tag_level = options.tag_level if options.tag_level is not None else _tag_level_from_env()
        self.pieces = PieceTracker(wait_for_room=self.options.when_full == "block")
        # a flight recording; its options are checked before anything is made on disk
        self.ring = (Ring(options.ring, options.ring_bytes, lambda pending: self.calls.discard(pending),
                          FlightPieces(self.pieces, SHARED_POOL))
                     if options.ring is not None else None)
        self.writer = SnapshotWriter(path, notes=options.notes, durability=options.durability)
        # strict capture writes on the calling thread, so that a failure raises in the call that met it
        self.calls = CallWriter(self.writer, SHARED_POOL, asynchronous=options.asynchronous and not self.strict,
                                depth=options.queue_depth, when_full=options.when_full, on_error=self._write_failed,
                                segment_bytes=options.segment_bytes, segment_seconds=options.segment_seconds)
        self.started = time.perf_counter()  # calls record their start from here
        self.stopped = False
        self._blob_ids = _BlobIds()
        # storages stored in chunks (device, address, bytes): a read of one is stored in chunks too,
        # not whole as a blob (a decode step's attention reads the cache the step wrote a row of)
        self._chunked_storages: collections.OrderedDict[tuple[torch.device, int, int], None] = \
            collections.OrderedDict()
        self._chunked_lock = threading.Lock()
        self.pieces.before_waiting = self.calls.hand_off
        self._reported: set[str] = set()
        self._report_lock = threading.Lock()
        # (after call, op): calls not recorded for want of room in the queue
        self._dropped: collections.Counter[tuple[int, str]] = collections.Counter()
        self._unrecorded_calls = 0  # captured into CUDA graphs the recording cannot follow
        self._unrecorded_replays = 0  # of graphs captured with no recording active
        self._spent = 0  # bytes of the calls handed to the writers (options.max_bytes)
        self.torch_ops: Any = None  # the dispatch mode recording operator calls (options.torch_ops), while on
        # the streams' order, fed by the waits the program makes (installed by lifecycle.start on a GPU)
        self.clocks = StreamClocks()
        self.storages = StorageIds()  # which storage each recorded tensor lived in (meta.memory)
        GraphRecording.__init__(self)

    @property
    def path(self) -> Path:
        return self.writer.path

    @property
    def calls_written(self) -> int:
        """Calls on disk so far (after flush() or close(), every call made before it)."""
        return self.calls.written

    def flush(self) -> None:
        """Return once every call made so far is written."""
        self.calls.flush()

    def dump(self) -> int:
        """A flight recording: write the calls it holds now and return how many (the ring is then
        empty; later calls fill it again). Otherwise: flush, and 0 (every call is written anyway)."""
        held, count, bases = self.ring.take() if self.ring is not None else ([], 0, [])
        for base, site in bases:  # the pieces the stores held name without holding them
            self.calls.put_base(base, site)
        taken: dict[int, Any] = {}  # the device rings read so far
        for pending in held:
            try:
                here = not isinstance(pending, PendingBatch) or pending.bring_over(taken)
                lost = "a later replay had filled its slot of the graph's device ring"
            except Exception as exc:  # said, never raised in place of the program's own error
                here, lost = False, f"reading the graph's device ring failed: {exc}"
            if not here:
                assert isinstance(pending, PendingBatch)  # only a replay is brought over
                count -= pending.count - pending.skip
                self.report(f"a CUDA graph replay held by the flight recording is not written: {lost}", stop=False)
                continue
            self.calls.submit(pending)
        self.calls.flush()
        return count

    def close(self) -> None:
        """Report the dropped calls, write every queued call, and flush the files to disk (a flight
        recording's held calls are let go: it writes only when dumped)."""
        held, _, bases = self.ring.take() if self.ring is not None else ([], 0, [])
        for pending in held:
            self.calls.discard(pending)
        for base, _ in bases:
            base.hashed(None)
        if self._unrecorded_calls or self._unrecorded_replays:
            self.report(f"CUDA graphs: {self._unrecorded_calls} calls captured where the recording cannot follow "
                        f"them (a capture begun before the recording began) and {self._unrecorded_replays} "
                        "replays of graphs captured with no recording active were not recorded; capture the "
                        "graph while recording", stop=False)
        if self._dropped:
            self.report(f"{sum(self._dropped.values())} calls not recorded: the capture queue was full "
                        f"(when_full='drop'): {_dropped_summary(self._dropped)}", stop=False)
        self.pieces.forget()
        try:
            self.calls.close()  # the manifest is written again there if it missed an error
        except OSError as exc:  # flushing to disk failed: the program goes on
            self.report(f"flushing {self.path} to disk failed: {exc}", stop=True)
        for blob in self._blob_ids.refs():  # copies no written call took (a flight recording's): reused
            blob.let_go(self.calls.release)
        if self.writer.unsaved_errors:
            log.warning(f"replay: capture: {self.path / MANIFEST} could not be written ({self.writer.unsaved_errors}): "
                        "its capture_errors lack what is said above")

    def report(self, message: str, *, stop: bool) -> None:
        """Say a capture error once, on stderr and in the manifest (raise it, when strict); with
        `stop`, capture ends (the program goes on)."""
        if self.strict:
            raise CaptureError(message)
        with self._report_lock:
            if stop:
                if self.stopped:  # another thread's failure already stopped capture
                    return
                self.stopped = True
            if message in self._reported:
                return
            self._reported.add(message)
        self._say(message)

    def _say(self, message: str) -> None:
        """On stderr (through logging) and in the manifest."""
        log.warning(f"replay: capture: {message}")
        try:
            self.writer.record_error(message)
        except OSError:  # a full disk: tried again when the recording closes, and said then if it still fails
            pass

    def _write_failed(self, what: str, exc: BaseException) -> None:
        self.report(f"{what} failed: {exc}; capture stopped", stop=True)

    def _store(self, copier: Copier, call: PendingCall, tensor: staging.Tensor) -> None:
        """Copy a tensor now into `call`: inline; large and read-only (`reusable`), as a blob,
        copied and hashed once however many calls pass it (a flight recording holds it once for
        all the calls that pass it); large state that calls write in place (`persistent`: a KV
        cache), in content-addressed chunks, so that a call which changed a few pages stores those
        pages. A fresh output gains nothing from chunks: it is inline. An output buffer (`unread`)
        is copied on its device over the call and stored after it (_store_before)."""
        t = tensor.value
        if tensor.unread and copier.hold_before(tensor.key, t, tensor.geometry):
            return
        if tensor.key.startswith("out/"):
            self._store_before(copier, call, tensor)
        chunked = tensor.geometry.span * t.element_size() >= max(self.options.chunk_threshold, 1) and (
            tensor.persistent or (tensor.reusable and self._stored_in_chunks(t)))
        if tensor.reusable and not chunked and t.numel() * t.element_size() >= self.options.blob_threshold:
            call.blobs[tensor.key] = (self.blob(t, copier, tensor.geometry), tensor.geometry)
        elif chunked:
            call.copies[tensor.key] = copier.copy_chunked(t, self.pieces, tensor.geometry)
            if tensor.persistent:
                self._note_chunked(t)
                call.writes_pieces = True
        else:
            call.copies[tensor.key] = copier.copy(t, geometry=tensor.geometry)

    def _stored_in_chunks(self, t: torch.Tensor) -> bool:
        return _storage_key(t) in self._chunked_storages

    def _note_chunked(self, t: torch.Tensor) -> None:
        """`t`'s storage is stored in chunks; the storages noted least lately go past CHUNKED_STORAGES
        (a block freed and given whole to another tensor is then stored in chunks too: another
        form, the same bytes)."""
        key = _storage_key(t)
        with self._chunked_lock:
            self._chunked_storages[key] = None
            self._chunked_storages.move_to_end(key)
            if len(self._chunked_storages) > CHUNKED_STORAGES:
                self._chunked_storages.popitem(last=False)

    def _store_before(self, copier: Copier, call: PendingCall, after: staging.Tensor) -> None:
        """The output buffer `after` is as it was before the call, if hold_before() kept it: stored
        as the mask of the elements the call left unchanged, made on its device (`kept/`): what
        torch.empty left in it never crosses to the host (replay/snapshot/unwritten.py). Where
        the call moved or resized it (an `out=` buffer an operator resized), or the device has no
        room for the mask, the bytes it held are stored instead."""
        name = after.key.partition("/")[2]
        key = f"in/{name}"
        held = copier.before(key)
        if held is None:
            return
        kept = copier.copy_unchanged(held, after.value, after.geometry)
        if kept is None:
            call.copies[key] = copier.copy_held(held)
            return
        # a host copy, its pieces hashed by a writer: a tracked store (a staging buffer, a table row, a
        # history) cost the program's thread more, for bytes a sixteenth of the buffer's or less
        kept.chunked = kept.geometry.span >= max(self.options.chunk_threshold, 1)
        call.copies[f"kept/{name}"] = kept
        call.befores[key] = (held.geometry, {"after": after.key, "unchanged": f"kept/{name}"})

    def blob(self, t: torch.Tensor, copier: Copier, geometry: Geometry | None = None) -> BlobRef:
        """The blob of a read-only tensor: the one taken already, while its version is the same;
        else a new one, whose bytes stay on the GPU until a writer finds whether the recording
        stored them before."""
        blob = self._blob_ids.get(t)
        if blob is None:
            # a flight recording keeps host copies: its ring holds blobs until a dump, far past the staging's
            copy = copier.copy_blob(t, self.pieces if self.ring is None else None, geometry)
            blob = BlobRef(copy)
            self._blob_ids.put(t, blob)
            self.spend(copy.nbytes)
        return blob

    def spend(self, nbytes: int) -> None:
        """Count bytes handed to the writers against the budget (options.max_bytes); past it, stop."""
        if not self.options.max_bytes or self.ring is not None:
            return
        with self._report_lock:
            self._spent += nbytes
            if self._spent < self.options.max_bytes or self.stopped:
                return
            self.stopped = True  # a budget the user set, no failure: said, never raised, even when strict
        self._say(f"the byte budget is spent: {self._spent} bytes recorded, max_bytes={self.options.max_bytes}; "
                  f"recording stopped after call {self.writer.next_index - 1} (the program went on)")

    def record(self, spec: staging.CallSpec, fn: Callable, signature: inspect.Signature | None,
               args: tuple, kwargs: dict) -> Any:
        """Run `fn` and record the call (intercept.wrap routes calls here; `signature` None: a call
        the recorder built, its arguments named in `kwargs`, staging.bind)."""
        if self.stopped or self.calls.failed:
            return fn(*args, **kwargs)
        if graphs.current_capture() is not None:
            return self.record_captured(spec, fn, signature, args, kwargs)
        if graphs.capturing_untracked():  # nothing may be issued into a graph the recorder does not follow
            self.count_unrecorded(calls=1)
            return fn(*args, **kwargs)
        if self.calls.when_full == "drop" and self.calls.full():
            self._dropped[(self.writer.next_index - 1, spec.op)] += 1
            return fn(*args, **kwargs)
        try:
            arguments = staging.bind(signature, args, kwargs)
        except TypeError:  # the call itself is wrong: let the function raise its own error
            return fn(*args, **kwargs)
        call = PendingCall(self.writer.reserve_index(), {})
        copier = Copier(self.calls.pool, before_call=True, buffers=self.pieces.buffers)
        footprint = Footprint(self.storages)
        store = footprint.noting(functools.partial(self._store, copier, call))
        try:
            with self.clocks.paused():
                described = staging.arguments(spec, arguments, store)
                copier.call_begins()
        except CaptureError as exc:
            self._abandon(call, copier)
            self.report(str(exc), stop=False)
            return fn(*args, **kwargs)
        except (OSError, TypeError, RuntimeError) as exc:
            self._abandon(call, copier)
            self.report(f"op '{spec.op}': could not copy inputs: {exc}; capture stopped", stop=True)
            return fn(*args, **kwargs)
        except BaseException:  # what it staged goes back before the error goes on
            self._abandon(call, copier)
            raise
        device = footprint.cuda_device()
        order = self.clocks.issue(stream_order.current_stream(device)) if device is not None else None
        with collecting(self.tag_level, arguments) as sink:
            started = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            except BaseException:
                self._abandon(call, copier)
                raise
        meta: dict[str, Any] = {"start_s": started - self.started, "duration_s": time.perf_counter() - started}
        staging.mark_written(spec, arguments)
        try:
            with self.clocks.paused():
                returned_json = staging.outputs(spec, arguments, result, sink, store)
                meta["memory"] = footprint.ranges
                if order is not None:
                    meta["order"] = order
                self._hand_over(call, copier, staging.header(spec, described, returned_json, sink.launches, meta))
        except CaptureError as exc:
            self._abandon(call, copier)
            self.report(str(exc), stop=False)
        except (OSError, TypeError, RuntimeError, ValueError) as exc:
            self._abandon(call, copier)
            self.report(f"op '{spec.op}': copying call {call.index} failed: {exc}; capture stopped", stop=True)
        except BaseException:
            self._abandon(call, copier)
            raise
        return result

    def _hand_over(self, call: PendingCall, copier: Copier, header: dict[str, Any]) -> None:
        """A call whose copies are all issued goes to the ring or the writers."""
        call.header = header
        call.ready = copier.mark()
        if self.ring is not None:
            self.ring.add(call)
        else:
            # its bytes summed only where a budget counts them, and before a writer (this thread's,
            # when synchronous) releases its copies
            nbytes = call.nbytes if self.options.max_bytes else 0
            self.calls.submit(call)
            self.spend(nbytes)

    def count_unrecorded(self, *, calls: int = 0, replays: int = 0) -> None:
        with self._report_lock:
            self._unrecorded_calls += calls
            self._unrecorded_replays += replays

    def _abandon(self, call: PendingCall, copier: Copier) -> None:
        """A call that failed before it was complete."""
        call.ready = copier.mark()
        self.calls.discard(call)


def _storage_key(t: torch.Tensor) -> tuple[torch.device, int, int]:
    """What names `t`'s storage among those stored in chunks: its device, address and bytes."""
    storage = t.untyped_storage()
    return t.device, storage.data_ptr(), storage.nbytes()


def _dropped_summary(dropped: collections.Counter[tuple[int, str]], shown: int = 20) -> str:
    """'3 rope after call 21; 1 attention after call 40', the first `shown` of them."""
    parts = [f"{count} {op} after call {index}" for (index, op), count in list(dropped.items())[:shown]]
    rest = len(dropped) - shown
    return "; ".join(parts) + (f"; and {rest} more" if rest > 0 else "")


def _tag_level_from_env() -> int:
    try:
        return settings.TAGS.get()
    except SettingError as exc:  # met as a recording starts: a capture error like any other
        raise CaptureError(str(exc)) from None
