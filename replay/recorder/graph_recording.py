"""A recording's path for calls inside CUDA graphs: staged at capture, written at every replay.

A call captured into a graph has its tensors staged inside the graph (replay/recorder/graphs.py)
and its description kept on the graph's tape; nothing is written until the graph is replayed.
After each replay the tape's slabs are copied to pinned host memory, one copy a slab, with the
weights that changed since the last replay, and handed over as one PendingBatch whose calls are
described from the tape by whoever writes them. In a flight recording whose graph has a device
ring, the slabs stay there: the batch names its replay, and a dump reads the ring. Recording
(replay/recorder/session.py) takes these methods; they use its writer, queue, ring, blobs and
report.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import time
from typing import TYPE_CHECKING, Any, Callable, cast

import torch

from replay.recorder import cuda_streams, graphs, staging
from replay.recorder.footprint import Footprint, StorageIds
from replay.recorder.copies import BlobRef, Copier, HostCopy
from replay.recorder.pipeline import PendingBatch, PendingCall
from replay.context import collecting, current_scope
from replay.errors import CaptureError
from replay.snapshot.tensors import geometry_of

if TYPE_CHECKING:
    from replay.recorder.options import RecordingOptions
    from replay.recorder.pipeline import CallWriter, Ring
    from replay.snapshot import SnapshotWriter
    from replay.snapshot.tensors import Geometry

# Inside a CUDA graph a read-only input from outside it this large is a weight, copied after a replay
# only when it changed; a smaller one is staged (bytes in the graph's batched copy cost less than a
# copy issued from the host)
GRAPH_WEIGHT_BYTES = 16 * 1024


class GraphRecording:
    """The CUDA-graph half of a Recording."""

    # What Recording (replay/recorder/session.py) sets and defines, declared for the checker only
    options: RecordingOptions
    tag_level: int
    ring: Ring | None
    writer: SnapshotWriter
    calls: CallWriter
    started: float
    stopped: bool
    storages: StorageIds
    _dropped: collections.Counter[tuple[int, str]]

    if TYPE_CHECKING:
        def report(self, message: str, *, stop: bool) -> None: ...

        def count_unrecorded(self, *, calls: int = 0, replays: int = 0) -> None: ...

        def spend(self, nbytes: int) -> None: ...

        def blob(self, t: torch.Tensor, copier: Copier, geometry: Geometry | None = None) -> BlobRef: ...

    def device_ring_plan(self) -> graphs.RingPlan | None:
        """What a graph captured now keeps of its replays on the device: a flight recording's,
        the graphs' rings sharing its ring_bytes."""
        return self._ring_plan

    def __init__(self) -> None:
        # graph id: its weights' versions (None: an inference tensor's), their blobs
        self._replay_blobs: dict[int, tuple[list[int | None], list[BlobRef]]] = {}
        self._ring_plan = (graphs.RingPlan(self.options.ring, self.options.ring_bytes)
                           if self.options.ring is not None else None)

    def record_captured(self, spec: staging.CallSpec, fn: Callable, signature: inspect.Signature | None,
                        args: tuple, kwargs: dict) -> Any:
        """A call being captured into a CUDA graph: stage its tensors inside the graph and keep its
        description on the graph's tape; nothing is written until the graph is replayed."""
        capture = graphs.current_capture()
        assert capture is not None
        try:
            arguments = staging.bind(signature, args, kwargs)
        except TypeError:  # the call itself is wrong: let the function raise its own error
            return fn(*args, **kwargs)
        mutated = [value for name, value in arguments.items()
                   if name in spec.mutates and isinstance(value, torch.Tensor)]
        staged: list[graphs.Staged] = []
        footprint = Footprint(self.storages)  # graph memory: the same bytes at every replay

        def stage_argument(tensor: staging.Tensor) -> None:
            t = tensor.value
            weight = (tensor.reusable and t.is_cuda and t.numel() * t.element_size() >= GRAPH_WEIGHT_BYTES
                      and capture.outside(t) and t.untyped_storage().data_ptr() not in capture.written)
            staged.append(capture.tape.weight(tensor) if weight else capture.stage(spec.op, tensor))
        try:
            described = staging.arguments(spec, arguments, footprint.noting(stage_argument))
        except CaptureError as exc:  # the call goes without a place on the tape: its writes are still staged first
            self.report(str(exc), stop=False)
            capture.before_write(mutated)
            result = fn(*args, **kwargs)
            staging.mark_written(spec, arguments)
            return result
        capture.before_write(mutated)
        # tags staged with the outputs, not copied at the tag (but those of memory the call writes)
        with collecting(self.tag_level, arguments, copy_tags=False,
                        written=frozenset(t.untyped_storage().data_ptr() for t in mutated)) as sink:
            result = fn(*args, **kwargs)
        moved = sink.tags_moved()
        if moved:
            self.report(f"op '{spec.op}' (in CUDA graph {capture.tape.graph_id}): tag(s) {', '.join(moved)} "
                        "written after they were taken: recorded as the call left them", stop=False)
        staging.mark_written(spec, arguments)  # before the outputs are staged: a later reader finds them
        _note_weights_written(spec, capture, arguments)
        try:
            stage = footprint.noting(lambda tensor: staged.append(capture.stage(spec.op, tensor)))
            returned_json = staging.outputs(spec, arguments, result, sink, stage)
        except CaptureError as exc:
            self.report(str(exc), stop=False)
            return result
        header = staging.header(spec, described, returned_json, sink.launches, {"memory": footprint.ranges})
        header["meta"]["graph"] = capture.tape.graph_id
        capture.tape.calls.append(graphs.CapturedCall(spec, header, staged))
        return result

    def record_replay(self, tape: graphs.Tape | None) -> None:
        """After a replay of a CUDA graph: copy its tape's slabs to the host (and the weights that
        changed since the last replay) and hand them over; the calls are described when written."""
        if tape is None:
            self.count_unrecorded(replays=1)
            return
        if tape.written_later and not tape.replays:
            self.report(f"CUDA graph {tape.graph_id}: {'; '.join(sorted(set(tape.written_later)))} "
                        "written later in the same graph: recorded as it is at the end of each replay", stop=False)
        tape.replays += 1
        if self.stopped or self.calls.failed or not tape.calls:
            return
        if self.ring is None and self.calls.when_full == "drop" and self.calls.full():
            self._dropped[(self.writer.next_index - 1, f"calls of CUDA graph {tape.graph_id}")] += len(tape.calls)
            return
        copier = Copier(self.calls.pool)
        host: list[HostCopy] = []
        on_device = self._device_ring(tape)  # the replay's bytes stay in its graph's device ring
        if on_device is not None and on_device.memory.is_cuda:
            tape.stream = cuda_streams.current(on_device.memory.device)  # where a dump reads the ring
        try:
            for slab, used in zip(tape.slabs, tape.used) if on_device is None else ():
                host.append(copier.copy(slab[:used]))
            weights = self._replay_weights(tape, copier)
        except BaseException as exc:
            copier.mark()()  # its checksums launched: nothing waits for a launch that never comes
            for copy in host:
                self.calls.release(copy)
            if not isinstance(exc, (OSError, TypeError, RuntimeError)):
                raise
            self.report(f"CUDA graph {tape.graph_id}: copying a replay failed: {exc}; capture stopped", stop=True)
            return
        first = self.writer.reserve_index(len(tape.calls))
        # labels of the scopes around the replay (the step it runs), over those seen at capture
        replay = {"scope": current_scope(), "start_s": time.perf_counter() - self.started,
                  "graph_replay": tape.replays}
        batch = PendingBatch(len(tape.calls), host, copier.mark(),
                             functools.partial(self._replay_calls, tape, first, host, weights, replay))
        if on_device is not None:
            batch.device_bytes = on_device.slot_bytes
            batch.fetch = functools.partial(self._from_device_ring, tape, tape.replays)
        if self.ring is not None:
            self.ring.add(batch)
        else:
            self.calls.submit(batch)
            self.spend(sum(copy.nbytes for copy in host))

    def _device_ring(self, tape: graphs.Tape) -> graphs.DeviceRing | None:
        """The tape's device ring, where this recording is a flight recording and the ring has a
        slot more than the replays its host ring can hold (a graph captured under a smaller ring
        comes over to the host at every replay instead)."""
        ring, plan = tape.ring, self._ring_plan
        if ring is None or plan is None or self.ring is None:
            return None
        return ring if ring.slots > plan.held(len(tape.calls), ring.slot_bytes) else None

    def _from_device_ring(self, tape: graphs.Tape, replay: int, taken: dict[int, Any]) -> list[HostCopy] | None:
        """Replay `replay`'s slabs from its slot of the device ring (None: a later replay has filled
        that slot since). A dump reads a tape's ring once (`taken`), while no replay of it starts,
        on the stream its replays ran on; the slot is found from the device's count of replays (the
        graph may have run unrecorded before this recording)."""
        ring, counter = tape.ring, tape.counter
        assert ring is not None and counter is not None
        if id(tape) not in taken:
            with tape.lock, torch.cuda.stream(tape.stream) if tape.stream is not None else contextlib.nullcontext():
                taken[id(tape)] = (int(counter.to("cpu")[0]), ring.memory.to("cpu", copy=True), tape.replays)
        turns, memory, replays = taken[id(tape)]
        slot = ring.back(turns, replays - replay)  # every replay since was this recording's
        if slot is None:
            return None
        spans = [memory[slot][start:start + used] if start is not None else slab[:used].to("cpu", copy=True)
                 for start, slab, used in zip(ring.starts, tape.slabs, tape.used)]
        return [HostCopy(span, geometry_of(span)) for span in spans]

    def _replay_weights(self, tape: graphs.Tape, copier: Copier) -> list[BlobRef]:
        """The blobs of the tape's weights, in tape order: a weight whose version has not moved
        since the last replay keeps its blob (a check, not a lookup); inference tensors have no
        version: taken at every replay, stored once by content."""
        versions = tape.weight_versions()
        # before the first replay every weight is taken (its last version None: none matches, and an
        # inference tensor's None is taken anyway), so the list returned holds no None
        unset = cast("list[BlobRef]", [None] * len(versions))
        last, blobs = self._replay_blobs.get(tape.graph_id, ([None] * len(versions), unset))
        if versions == last and None not in versions:
            return blobs
        blobs = list(blobs)  # a new list: the replays held keep theirs
        for n, (staged, version) in enumerate(zip(tape.weights, versions)):
            if version is None or version != last[n]:
                blobs[n] = self.blob(staged.tensor, copier, staged.geometry)
        self._replay_blobs[tape.graph_id] = (versions, blobs)
        return blobs

    def _replay_calls(self, tape: graphs.Tape, first: int, host: list[HostCopy], weights: list[BlobRef],
                      replay: dict[str, Any], skip: int) -> list[PendingCall]:
        """The calls of one replay from the `skip`-th on, their tensors views into the host slabs."""
        calls = []
        blobs = iter(weights)
        for n, captured in enumerate(tape.calls):
            call_blobs = {s.key: (next(blobs), s.geometry) for s in captured.tensors if s.weight}
            if n < skip:
                continue
            meta = captured.header["meta"]
            call = PendingCall(first + n, dict(captured.header, meta={**meta, **replay,
                                                                      "scope": {**meta["scope"], **replay["scope"]}}),
                               blobs=call_blobs)
            for s in captured.tensors:
                if not s.weight:
                    span = host[s.slab].span[s.offset:s.offset + s.nbytes].view(s.tensor.dtype)
                    copy = call.copies[s.key] = HostCopy(span, s.geometry)
                    copy.chunked = s.persistent and copy.nbytes >= max(self.options.chunk_threshold, 1)
            calls.append(call)
        return calls


def _note_weights_written(spec: staging.CallSpec, capture: graphs.Capture, bound: dict[str, Any]) -> None:
    """A tensor this call mutates is no weight for the calls after it in the graph; one that an
    earlier call of the graph read as a weight is recorded as the graph's end leaves it (said once)."""
    for name in spec.mutates:
        value = bound.get(name)
        if isinstance(value, torch.Tensor):
            address = value.untyped_storage().data_ptr()
            capture.written.add(address)
            capture.tape.written_later += [
                f"op '{call.spec.op}' {s.what}" for call in capture.tape.calls for s in call.tensors
                if s.weight and s.tensor.untyped_storage().data_ptr() == address]
