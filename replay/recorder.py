"""Recording calls into a snapshot while a recording is active.

With no recording active a captured function costs one global check. While one is, each
call's inputs are copied before it runs (so an in-place kernel still replays from its
true inputs), its outputs and mutated arguments after, with any tags and launch records
the call made; replay/capture_pipeline.py writes the copies on threads of their own. A
call captured into a CUDA graph is recorded at each replay of the graph
(replay/graph_capture.py). Capture never crashes the program it records unless
REPLAY_CAPTURE_STRICT=1: failures are reported once on stderr and in the manifest.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import contextvars
import functools
import inspect
import math
import os
import signal
import sys
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import torch

from replay import graph_capture
from replay.capture_pipeline import (DEFAULT_QUEUE_DEPTH, SHARED_POOL, BlobRef, CallWriter, Copier, HostCopy,
                                     PendingBatch, PendingCall, Ring, check_options)
from replay import settings
from replay.errors import CaptureError, ReplayError
from replay.settings import SettingError
from replay.snapshot import SnapshotWriter
from replay.snapshot.writer import MANIFEST
from replay.snapshot import jsonargs
from replay.snapshot.schema import check_name
from replay.snapshot.tensors import UnsupportedTensor, geometry_of

BLOB_THRESHOLD_BYTES = 64 * 1024
CHUNK_THRESHOLD_BYTES = 1 << 20
DEFAULT_RING_BYTES = 1 << 30
# Inside a CUDA graph a read-only input from outside it this large is a weight, copied after a replay
# only when it changed; a smaller one is staged (bytes in the graph's batched copy cost less than a
# copy issued from the host)
GRAPH_WEIGHT_BYTES = 16 * 1024

_recording: "Recording | None" = None
# op name -> the verifier's hook for its calls (replay.verify): (spec, call, signature, args, kwargs) -> result
_verifiers: dict[str, Callable[..., Any]] = {}
_intercepting = False  # a recording is active or an op is verified: captured calls take the slow path
_capture_hooks: list[Callable[[], object]] = []  # run before a CUDA graph capture begins (before_graph_capture)
_start_lock = threading.Lock()  # two threads starting recordings at once: one wins
_sink: contextvars.ContextVar["CallSink | None"] = contextvars.ContextVar("replay_sink", default=None)
_scope: contextvars.ContextVar[tuple[tuple[str, Any], ...]] = contextvars.ContextVar("replay_scope", default=())


@dataclass(frozen=True)
class CallSpec:
    """What capture needs to know about the function it records."""

    op: str
    variant: str
    provider: str | None
    state: tuple[str, ...] = ()
    mutates: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()


@dataclass
class CallSink:
    """Collects the tags and launch records of one running call."""

    level: int
    arguments: Mapping[str, Any] = field(default_factory=dict)  # the call's, to name what a kernel is handed
    tags: dict[str, torch.Tensor] = field(default_factory=dict)
    launches: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # tags that were not tensors, described

    def argument_holding(self, pointer: torch.Tensor) -> str | None:
        """The call argument a kernel's tensor argument is, or is a view into: the same address
        first, else the argument whose storage holds it."""
        tensors = [(n, t) for n, t in self.arguments.items() if isinstance(t, torch.Tensor)]
        for name, tensor in tensors:
            if tensor.data_ptr() == pointer.data_ptr() and tensor.device == pointer.device:
                return name
        address = pointer.data_ptr()
        for name, tensor in tensors:
            storage = tensor.untyped_storage()
            if tensor.device == pointer.device and storage.data_ptr() <= address < storage.data_ptr() + storage.nbytes():
                return name
        return None

    def add_tag(self, name: str, tensor: torch.Tensor) -> None:
        if not isinstance(tensor, torch.Tensor):  # a recording reports it; a replay skips it
            self.rejected.append(f"tag '{name}' is a value of type {type(tensor).__name__}, not a tensor")
            return
        try:
            check_name(name, "tag")
        except ValueError as exc:  # no text: a snapshot could not hold it
            self.rejected.append(str(exc))
            return
        key, n = name, 1
        while key in self.tags:
            key, n = f"{name}.{n}", n + 1
        self.tags[key] = tensor.detach().clone()


@contextlib.contextmanager
def collecting(level: int = 2, arguments: Mapping[str, Any] | None = None) -> Iterator[CallSink]:
    """Collect tags (up to `level`) and launch records of the code run inside; `arguments`, the
    call's, name the tensors its kernels are handed (a launch record's `binds`)."""
    sink = CallSink(level, dict(arguments or {}))
    token = _sink.set(sink)
    try:
        yield sink
    finally:
        _sink.reset(token)


def tag(name: str, tensor: torch.Tensor, level: int = 1) -> torch.Tensor:
    """Record an intermediate of the running call under `name`, for replay to compare.

    Replay compares tags in the order they were recorded and names the first that
    diverges, so tag what explains a wrong output (positions written, rstd, lse). With
    no recording or replay running this is one context-variable read.

    Args:
        name: the tag's name; a repeated name within one call gets `.1`, `.2`, ...
        tensor: the value (copied now; later writes to it do not change the tag). Anything
            but a tensor is a capture error: that call is not recorded (replay skips it).
        level: 1 (recorded by default) or 2 (only with REPLAY_TAGS=2: costly or verbose).

    Returns:
        `tensor` itself, so a tag can wrap an expression.

    Example:
        rstd = replay.tag("rstd", 1.0 / torch.sqrt(ms + eps))
    """
    sink = _sink.get()
    if sink is not None and level <= sink.level:
        sink.add_tag(name, tensor)
    return tensor


@contextlib.contextmanager
def scope(name: str, value: int | float | str | bool) -> Iterator[None]:
    """Label the calls made inside the block: each recorded call keeps the labels of the scopes
    around it (`{"step": 2, "layer": 3}`), which `replay trace` draws as nested slices and
    `replay kv-check` uses to find a layer's cache. Costs one context-variable set with no
    recording active.

    Args:
        name: what is being labelled: "step" and "layer" are drawn as the timeline's levels,
            "run" separates the runs `replay kv-check SNAPSHOT` compares; any other is kept as is.
        value: its value (a number or a short string).

    Example:
        for i, layer in enumerate(layers):
            with replay.scope("layer", i):
                h = layer(h)
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"replay.scope: the name must be a non-empty string, got {name!r}")
    if not isinstance(value, (int, float, str, bool)) or (isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"replay.scope({name!r}): the value must be a finite number or a string, got {value!r}")
    token = _scope.set((*_scope.get(), (name, value)))
    try:
        yield
    finally:
        _scope.reset(token)


def current_scope() -> dict[str, Any]:
    """The labels of the scopes around the running code, outermost first."""
    return dict(_scope.get())


def launches_wanted() -> bool:
    """Whether a call is being recorded or replayed now, so that launch records are kept (a kernel
    library may skip working out what it would record otherwise)."""
    return _sink.get() is not None


def record_launch(kernel: str, grid: Any = None, *, compiled: Any = None,
                  pointers: Mapping[str, torch.Tensor] | None = None, **info: Any) -> None:
    """Record a kernel launch into the running call's launch records (a no-op outside one).

    Args:
        kernel: the kernel's name.
        grid: the launch grid (any sequence of ints).
        compiled: the object a Triton launch returns; its warps, stages, shared memory,
            registers and hash (of the compiled kernel) are recorded when the backend reports
            them (a GPU does; the interpreter does not).
        pointers: the kernel's tensor arguments by its parameter names; recorded as `binds`,
            parameter -> the call's argument it points into (`src_pos_ptr` -> `position_buf`).
        **info: anything else worth keeping, JSON or kept as its repr: block sizes,
            `path="indirect"` for which of two code paths ran.

    Returns:
        None.

    Example:
        compiled = kernel[grid](x, out, n, BLOCK=block)
        replay.record_launch("rmsnorm_kernel", grid, compiled=compiled, BLOCK=block, path="direct")
    """
    sink = _sink.get()
    if sink is None:
        return
    entry: dict[str, Any] = {"kernel": kernel, "grid": list(grid) if grid is not None else None}
    meta = getattr(compiled, "metadata", None)
    for attr in ("num_warps", "num_stages", "shared", "hash"):
        if meta is not None and hasattr(meta, attr):
            entry[attr] = getattr(meta, attr)
    if getattr(compiled, "n_regs", None) is not None:
        entry["registers"] = compiled.n_regs
    try:
        binds = {param: sink.argument_holding(tensor) for param, tensor in (pointers or {}).items()
                 if isinstance(tensor, torch.Tensor)}
    except RuntimeError:  # a tensor without storage (sparse, meta): informational, never fatal
        binds = {}
    if any(binds.values()):
        entry["binds"] = {param: name for param, name in binds.items() if name is not None}
    entry.update(info)
    sink.launches.append({key: _json_or_repr(value) for key, value in entry.items()})


def _json_or_repr(value: Any) -> Any:
    """Launch details are informational: keep what JSON cannot hold as its repr."""
    try:
        return jsonargs.encode(value)
    except jsonargs.NotJSONRepresentable:
        try:
            return repr(value)
        except Exception:  # a failing __repr__, an int too long to print: never crash the program
            return f"<{type(value).__name__}>"


def _json(spec: CallSpec, what: str, value: Any) -> Any:
    """`value` as JSON, or a CaptureError naming the op and `what`: the call is not recorded."""
    try:
        return jsonargs.encode(value)
    except jsonargs.NotJSONRepresentable as exc:
        raise CaptureError(f"op '{spec.op}': {what} is neither a tensor nor JSON-representable: "
                           f"{' '.join(str(exc).split())}; call not recorded") from None


def returned_values(result: Any, names: tuple[str, ...]) -> dict[str, Any]:
    if result is None:
        return {}
    if isinstance(result, dict):
        return dict(result)
    values = result if isinstance(result, (tuple, list)) else (result,)
    default = ("out",) if len(values) == 1 else tuple(f"out{i}" for i in range(len(values)))
    chosen = names if len(names) == len(values) else default
    return dict(zip(chosen, values))


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
        alive = weakref.ref(base, lambda dead, key=key: self._forget(key, dead))
        with self._lock:
            self._ids[key] = (alive, blob)

    def _forget(self, key: tuple, dead: weakref.ref) -> None:
        # Runs from the garbage collector, possibly while this thread holds the lock:
        # a single dict operation under the GIL needs no lock.
        if self._ids.get(key, (None,))[0] is dead:
            self._ids.pop(key, None)


class Recording:
    """An active recording into one snapshot directory."""

    def __init__(self, path: str | Path, *, notes: str = "", tag_level: int | None = None,
                 strict: bool | None = None, blob_threshold: int = BLOB_THRESHOLD_BYTES,
                 chunk_threshold: int = CHUNK_THRESHOLD_BYTES, asynchronous: bool = True,
                 queue_depth: int = DEFAULT_QUEUE_DEPTH, when_full: str = "block", durability: str = "close",
                 ring: int | None = None, ring_bytes: int = DEFAULT_RING_BYTES):
        self.strict = strict if strict is not None else settings.CAPTURE_STRICT.get()
        self.tag_level = tag_level if tag_level is not None else _tag_level_from_env()
        self.blob_threshold, self.chunk_threshold = blob_threshold, chunk_threshold
        check_options(queue_depth, when_full)
        # a flight recording; its options are checked before anything is made on disk
        self.ring = Ring(ring, ring_bytes, lambda pending: self.calls.discard(pending)) if ring is not None else None
        self.writer = SnapshotWriter(path, notes=notes, durability=durability)
        # strict capture writes on the calling thread, so that a failure raises in the call that met it
        self.calls = CallWriter(self.writer, SHARED_POOL, asynchronous=asynchronous and not self.strict,
                                depth=queue_depth, when_full=when_full, on_error=self._write_failed)
        self.started = time.perf_counter()  # calls record their start from here
        self.stopped = False
        self._blob_ids = _BlobIds()
        self._reported: set[str] = set()
        self._report_lock = threading.Lock()
        self._dropped: collections.Counter[tuple[int, str]] = collections.Counter()  # (after call, op): calls
        # not recorded for want of room in the queue
        self._unrecorded_calls = 0  # captured into CUDA graphs the recording cannot follow
        self._unrecorded_replays = 0  # of graphs captured with no recording active
        self._replay_blobs: dict[int, tuple[list, list[BlobRef]]] = {}  # graph id: its weights' versions, blobs

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
        held, count = self.ring.take() if self.ring is not None else ([], 0)
        for pending in held:
            self.calls.submit(pending)
        self.calls.flush()
        return count

    def close(self) -> None:
        """Report the dropped calls, write every queued call, and flush the files to disk (a flight
        recording's held calls are let go: it writes only when dumped)."""
        for pending in self.ring.take()[0] if self.ring is not None else []:
            self.calls.discard(pending)
        if self._unrecorded_calls or self._unrecorded_replays:
            self._report(f"CUDA graphs: {self._unrecorded_calls} calls captured where the recording cannot follow "
                         f"them (a capture begun before the recording began) and {self._unrecorded_replays} "
                         "replays of graphs captured with no recording active were not recorded; capture the "
                         "graph while recording", stop=False)
        if self._dropped:
            self._report(f"{sum(self._dropped.values())} calls not recorded: the capture queue was full "
                         f"(when_full='drop'): {_dropped_summary(self._dropped)}", stop=False)
        try:
            self.calls.close()  # the manifest is written again there if it missed an error
        except OSError as exc:  # flushing to disk failed: the program goes on
            self._report(f"flushing {self.path} to disk failed: {exc}", stop=True)
        for blob in self._blob_ids.refs():  # copies no written call took (a flight recording's): reused
            blob.let_go(self.calls.release)
        if self.writer.unsaved_errors:
            print(f"replay: capture: {self.path / MANIFEST} could not be written ({self.writer.unsaved_errors}): "
                  "its capture_errors lack what is said above", file=sys.stderr)

    def _report(self, message: str, *, stop: bool) -> None:
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
        print(f"replay: capture: {message}", file=sys.stderr)
        try:
            self.writer.record_error(message)
        except OSError:  # a full disk: tried again when the recording closes, and said then if it still fails
            pass

    def _write_failed(self, what: str, exc: BaseException) -> None:
        self._report(f"{what} failed: {exc}; capture stopped", stop=True)

    def _store(self, spec: CallSpec, what: str, t: torch.Tensor, copier: Copier, call: PendingCall, key: str,
               reusable: bool = False, persistent: bool = False) -> None:
        """Copy a tensor now into `call`: inline; large and read-only (`reusable`), as a blob,
        copied and hashed once however many calls pass it (a flight recording holds it once for
        all the calls that pass it); large state that calls write in place (`persistent`: a KV
        cache), in content-addressed chunks, so that a call which changed a few pages stores those
        pages. A fresh output gains nothing from chunks: it is inline."""
        try:
            geometry = geometry_of(t)
        except UnsupportedTensor as exc:
            raise CaptureError(f"op '{spec.op}': {what}: {exc}; call not recorded") from None
        if reusable and t.numel() * t.element_size() >= self.blob_threshold:
            call.blobs[key] = (self._blob(t, copier), geometry)
        else:
            copy = call.copies[key] = copier.copy(t)
            copy.chunked = persistent and copy.nbytes >= max(self.chunk_threshold, 1)

    def _blob(self, t: torch.Tensor, copier: Copier) -> BlobRef:
        """The blob of a read-only tensor: the one taken already, while its version is the same."""
        blob = self._blob_ids.get(t)
        if blob is None:
            blob = BlobRef(copier.copy(t, landed=True))
            self._blob_ids.put(t, blob)
        return blob

    def record(self, spec: CallSpec, fn: Callable, signature: inspect.Signature,
               args: tuple, kwargs: dict) -> Any:
        if self.stopped or self.calls.failed:
            return fn(*args, **kwargs)
        if graph_capture.current_capture() is not None:
            return self._record_captured(spec, fn, signature, args, kwargs)
        if graph_capture.capturing_untracked():  # nothing may be issued into a graph the recorder does not follow
            self._count_unrecorded(calls=1)
            return fn(*args, **kwargs)
        if self.calls.when_full == "drop" and self.calls.full():
            self._dropped[(self.writer.next_index - 1, spec.op)] += 1
            return fn(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:  # the call itself is wrong: let the function raise its own error
            return fn(*args, **kwargs)
        bound.apply_defaults()
        call = PendingCall(self.writer.reserve_index(), {})
        copier = Copier(self.calls.pool)
        arg_list: list[dict[str, Any]] = []
        try:
            for name, value in bound.arguments.items():
                if isinstance(value, torch.Tensor):
                    role = "state" if name in spec.state else "in"
                    key = f"{role}/{name}"
                    self._store(spec, f"argument '{name}'", value, copier, call, key,
                                reusable=role == "in" and name not in spec.mutates,
                                persistent=role == "state" or name in spec.mutates)
                    arg_list.append({"name": name, "tensor": key})
                else:
                    arg_list.append({"name": name, "json": _json(spec, f"argument '{name}'", value)})
        except CaptureError as exc:
            self._abandon(call, copier)
            self._report(str(exc), stop=False)
            return fn(*args, **kwargs)
        except (OSError, TypeError, RuntimeError) as exc:
            self._abandon(call, copier)
            self._report(f"op '{spec.op}': could not copy inputs: {exc}; capture stopped", stop=True)
            return fn(*args, **kwargs)

        sink = CallSink(self.tag_level, bound.arguments)
        token = _sink.set(sink)
        started = time.perf_counter()
        try:
            result = fn(*args, **kwargs)
        except BaseException:
            self._abandon(call, copier)
            raise
        finally:
            _sink.reset(token)
        timing = {"start_s": started - self.started, "duration_s": time.perf_counter() - started}
        _mark_written(spec, bound.arguments)
        try:
            self._finish(spec, call, copier, arg_list, bound.arguments, result, sink, timing)
        except CaptureError as exc:
            self._abandon(call, copier)
            self._report(str(exc), stop=False)
        except (OSError, TypeError, RuntimeError, ValueError) as exc:
            self._abandon(call, copier)
            self._report(f"op '{spec.op}': copying call {call.index} failed: {exc}; capture stopped", stop=True)
        return result

    def _finish(self, spec: CallSpec, call: PendingCall, copier: Copier, arg_list: list, arguments: dict,
                result: Any, sink: CallSink, timing: dict[str, float]) -> None:
        """Copy the outputs and tags, and hand the call to the writer."""
        returned_json = {}
        for name, value in _outputs(spec, arguments, result, sink).items():
            if isinstance(value, torch.Tensor):
                self._store(spec, f"output '{name}'", value, copier, call, f"out/{name}",
                            persistent=name in spec.mutates)
            else:
                returned_json[name] = _json(spec, f"output '{name}'", value)
        for name, value in sink.tags.items():
            self._store(spec, f"tag '{name}'", value, copier, call, f"tag/{name}")
        self._hand_over(call, copier, _header(spec, arg_list, returned_json, sink.launches, timing))

    def _hand_over(self, call: PendingCall, copier: Copier, header: dict[str, Any]) -> None:
        """A call whose copies are all issued goes to the ring or the writers."""
        call.header = header
        call.ready = copier.mark()
        if self.ring is not None:
            self.ring.add(call)
        else:
            self.calls.submit(call)

    # calls inside CUDA graphs (replay/graph_capture.py) ----------------------------------------

    def _record_captured(self, spec: CallSpec, fn: Callable, signature: inspect.Signature,
                         args: tuple, kwargs: dict) -> Any:
        """A call being captured into a CUDA graph: stage its tensors inside the graph and keep its
        description on the graph's tape; nothing is written until the graph is replayed."""
        capture = graph_capture.current_capture()
        assert capture is not None
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:  # the call itself is wrong: let the function raise its own error
            return fn(*args, **kwargs)
        bound.apply_defaults()
        mutated = [value for name, value in bound.arguments.items()
                   if name in spec.mutates and isinstance(value, torch.Tensor)]

        def untaped() -> Any:
            """The call run without a place on the tape: what it writes is still copied first."""
            capture.before_write(mutated)
            result = fn(*args, **kwargs)
            _mark_written(spec, bound.arguments)
            return result
        staged: list[graph_capture.Staged] = []
        arg_list: list[dict[str, Any]] = []
        try:
            for name, value in bound.arguments.items():
                if not isinstance(value, torch.Tensor):
                    arg_list.append({"name": name, "json": _json(spec, f"argument '{name}'", value)})
                    continue
                role = "state" if name in spec.state else "in"
                key, what = f"{role}/{name}", f"argument '{name}'"
                weight = (role == "in" and name not in spec.mutates and value.is_cuda
                          and value.numel() * value.element_size() >= GRAPH_WEIGHT_BYTES
                          and capture.outside(value) and value.untyped_storage().data_ptr() not in capture.written)
                staged.append(capture.tape.weight(key, what, value) if weight else
                              capture.stage(spec.op, key, what, value, persistent=role == "state" or name in spec.mutates))
                arg_list.append({"name": name, "tensor": key})
        except (CaptureError, UnsupportedTensor) as exc:
            self._not_captured(spec, exc)
            return untaped()
        capture.before_write(mutated)
        sink = CallSink(self.tag_level, bound.arguments)
        token = _sink.set(sink)
        try:
            result = fn(*args, **kwargs)
        finally:
            _sink.reset(token)
        _mark_written(spec, bound.arguments)  # before the outputs are staged: a later reader finds them
        try:
            header, outputs = self._captured_outputs(spec, capture, bound.arguments, result, sink, arg_list)
        except (CaptureError, UnsupportedTensor) as exc:
            self._not_captured(spec, exc)
            return result
        capture.tape.calls.append(graph_capture.CapturedCall(spec, header, staged + outputs))
        return result

    def _not_captured(self, spec: CallSpec, exc: Exception) -> None:
        """A call the graph's tape goes without (reported once; the program goes on)."""
        self._report(str(exc) if isinstance(exc, CaptureError) else f"op '{spec.op}': {exc}; call not recorded",
                     stop=False)

    def _captured_outputs(self, spec: CallSpec, capture: graph_capture.Capture, arguments: dict, result: Any,
                          sink: CallSink, arg_list: list) -> tuple[dict[str, Any], list[graph_capture.Staged]]:
        """A captured call's header and its staged outputs, mutated arguments and tags."""
        staged, returned_json = [], {}
        for name, value in _outputs(spec, arguments, result, sink).items():
            if isinstance(value, torch.Tensor):
                staged.append(capture.stage(spec.op, f"out/{name}", f"output '{name}'", value,
                                            persistent=name in spec.mutates))
            else:
                returned_json[name] = _json(spec, f"output '{name}'", value)
        for name in spec.mutates:  # a weight an earlier call of this graph reads is written here
            value = arguments.get(name)
            if isinstance(value, torch.Tensor):
                address = value.untyped_storage().data_ptr()
                capture.written.add(address)
                capture.tape.written_later += [
                    f"op '{call.spec.op}' {s.what}" for call in capture.tape.calls for s in call.tensors
                    if s.weight and s.tensor.untyped_storage().data_ptr() == address]
        staged += [capture.stage(spec.op, f"tag/{name}", f"tag '{name}'", value) for name, value in sink.tags.items()]
        header = _header(spec, arg_list, returned_json, sink.launches, {})
        header["meta"]["graph"] = capture.tape.graph_id
        return header, staged

    def record_replay(self, tape: graph_capture.Tape | None) -> None:
        """After a replay of a CUDA graph: copy its tape's slabs to the host (and the weights that
        changed since the last replay) and hand them over; the calls are described when written."""
        if tape is None:
            self._count_unrecorded(replays=1)
            return
        if tape.written_later and not tape.replays:
            self._report(f"CUDA graph {tape.graph_id}: {'; '.join(sorted(set(tape.written_later)))} "
                         "written later in the same graph: recorded as it is at the end of each replay",
                         stop=False)
        tape.replays += 1
        if self.stopped or self.calls.failed or not tape.calls:
            return
        if self.ring is None and self.calls.when_full == "drop" and self.calls.full():
            self._dropped[(self.writer.next_index - 1, f"calls of CUDA graph {tape.graph_id}")] += len(tape.calls)
            return
        copier = Copier(self.calls.pool)
        host: list[HostCopy] = []
        try:
            for slab, used in zip(tape.slabs, tape.used):
                host.append(copier.copy(slab[:used]))
            weights = self._replay_weights(tape, copier)
        except (OSError, TypeError, RuntimeError) as exc:
            copier.mark()()
            for copy in host:
                self.calls.release(copy)
            self._report(f"CUDA graph {tape.graph_id}: copying a replay failed: {exc}; capture stopped", stop=True)
            return
        first = self.writer.reserve_index(len(tape.calls))
        # labels of the scopes around the replay (the step it runs), over those seen at capture
        replay = {"scope": current_scope(), "start_s": time.perf_counter() - self.started,
                  "graph_replay": tape.replays}
        batch = PendingBatch(len(tape.calls), host, copier.mark(),
                             functools.partial(self._replay_calls, tape, first, host, weights, replay))
        if self.ring is not None:
            self.ring.add(batch)
        else:
            self.calls.submit(batch)

    def _replay_weights(self, tape: graph_capture.Tape, copier: Copier) -> list[BlobRef]:
        """The blobs of the tape's weights, in tape order: a weight whose version has not moved
        since the last replay keeps its blob (a check, not a lookup); inference tensors have no
        version: taken at every replay, stored once by content."""
        versions = [None if s.tensor.is_inference() else s.tensor._version for s in tape.weights]
        last, blobs = self._replay_blobs.get(tape.graph_id, ([None] * len(versions), [None] * len(versions)))
        if versions == last and None not in versions:
            return blobs
        blobs = list(blobs)  # a new list: the replays held keep theirs
        for n, (staged, version) in enumerate(zip(tape.weights, versions)):
            if version is None or version != last[n]:
                blobs[n] = self._blob(staged.tensor, copier)
        self._replay_blobs[tape.graph_id] = (versions, blobs)
        return blobs

    def _replay_calls(self, tape: graph_capture.Tape, first: int, host: list[HostCopy], weights: list[BlobRef],
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
                    copy.chunked = s.persistent and copy.nbytes >= max(self.chunk_threshold, 1)
            calls.append(call)
        return calls

    def _count_unrecorded(self, *, calls: int = 0, replays: int = 0) -> None:
        with self._report_lock:
            self._unrecorded_calls += calls
            self._unrecorded_replays += replays

    def _abandon(self, call: PendingCall, copier: Copier) -> None:
        """A call that failed before it was complete."""
        call.ready = copier.mark()
        self.calls.discard(call)


def _outputs(spec: CallSpec, arguments: Mapping[str, Any], result: Any, sink: CallSink) -> dict[str, Any]:
    """What a call left: its returned values and the arguments it mutates (a CaptureError if it
    tagged something that is not a tensor)."""
    if sink.rejected:
        raise CaptureError(f"op '{spec.op}': {sink.rejected[0]}; call not recorded")
    outputs = returned_values(result, spec.outputs)
    outputs.update({name: arguments[name] for name in spec.mutates if isinstance(arguments.get(name), torch.Tensor)})
    return outputs


def _header(spec: CallSpec, arg_list: list, returned_json: dict, launches: list, timing: dict) -> dict[str, Any]:
    return {"op": spec.op, "variant": spec.variant, "provider": spec.provider, "args": arg_list,
            "returns_json": returned_json, "launch": launches,
            "meta": {**timing, "thread": threading.current_thread().name, "scope": current_scope()}}


def _mark_written(spec: CallSpec, arguments: Mapping[str, Any]) -> None:
    """Move the version counter of every tensor the op says it mutates: a kernel writing through
    a pointer moves none, and a later call reading that tensor must not be given the blob of an
    earlier one (blobs are found again by version)."""
    for name in spec.mutates:
        value = arguments.get(name)
        if isinstance(value, torch.Tensor) and not value.is_inference():
            torch.autograd.graph.increment_version(value)


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


def active() -> Recording | None:
    return _recording


def start(path: str | Path, **options: Any) -> Recording:
    """Start recording every captured call into a new snapshot at `path` (options: `recording`'s)."""
    global _recording
    with _start_lock:
        if _recording is not None:
            raise CaptureError(f"{path}: a recording into {_recording.path} is already active")
        _recording = Recording(path, **options)
        _update_intercepting()
        if _recording.ring is not None:
            _install_signal_handlers()
        return _recording


def stop() -> Recording | None:
    """Stop the active recording, if any: write what is queued, flush it to disk, and return it."""
    global _recording
    with _start_lock:
        rec, _recording = _recording, None
        _update_intercepting()
    if rec is not None:
        _restore_signal_handlers()
        rec.close()
    return rec


def _on_graph_replay(tape: graph_capture.Tape | None) -> None:
    rec = _recording
    if rec is not None:
        rec.record_replay(tape)


def set_verifier(op: str, hook: Callable[..., Any] | None) -> None:
    """Route the captured calls of `op` through `hook` (replay.verify), or no longer (None)."""
    with _start_lock:
        if hook is None:
            _verifiers.pop(op, None)
        else:
            _verifiers[op] = hook
        _update_intercepting()


def _update_intercepting() -> None:
    global _intercepting
    _intercepting = _recording is not None or bool(_verifiers)
    if _intercepting:
        graph_capture.install(_on_graph_replay, _before_graph_capture)
    else:
        graph_capture.uninstall()


def before_graph_capture(hook: Callable[[], object]) -> None:
    """Run `hook` before a CUDA graph capture begins while calls are intercepted (the verifier
    drains its checks: a CUDA call on its worker thread would break the capture)."""
    _capture_hooks.append(hook)


def _before_graph_capture() -> bool:
    """Stop background CUDA work (the recording's writers wait for copies) before a capture begins;
    whether a recording is active to follow the graph."""
    rec = _recording
    if rec is not None:
        rec.flush()
    for hook in _capture_hooks:
        hook()
    return rec is not None


def flush() -> None:
    """Return once every call the active recording has captured so far is written (no-op without one)."""
    rec = _recording
    if rec is not None:
        rec.flush()


def dump() -> int:
    """A flight recording (`recording(path, ring=N)`): write the last calls it holds now, and go on
    recording; returns how many were written. Any other recording writes every call anyway:
    this flushes it and returns 0."""
    rec = _recording
    return rec.dump() if rec is not None else 0


_FLIGHT_SIGNALS = tuple(s for s in (getattr(signal, "SIGUSR1", None), signal.SIGTERM) if s is not None)
_previous_handlers: dict[int, Any] = {}


class _Termination:
    """Where a SIGTERM's dump stands: a second SIGTERM during it does not cut it short."""

    dumping = False  # the dump thread runs
    dumped = False  # it is done: the next SIGTERM (its own) goes to the handler there was before


def _install_signal_handlers() -> None:
    """SIGUSR1 dumps a flight recording and goes on; SIGTERM dumps it, closes it and lets the
    signal do what it did before (by default, end the process). Only the main thread may set
    handlers: elsewhere dump() and an exception leaving the block still write."""
    if threading.current_thread() is threading.main_thread():
        for number in _FLIGHT_SIGNALS:
            _previous_handlers[number] = signal.signal(number, _on_signal)


def _restore_signal_handlers() -> None:
    if threading.current_thread() is threading.main_thread():
        while _previous_handlers:
            number, previous = _previous_handlers.popitem()
            signal.signal(number, previous if previous is not None else signal.SIG_DFL)


def _on_signal(number: int, frame: Any) -> None:
    """Runs on the main thread between two bytecodes, maybe while it holds a lock the writer needs:
    it waits for nothing. The work happens on a thread of its own; for SIGTERM that thread sends
    the signal again once the calls are on disk, and this handler passes it on to the handler
    there was before. A SIGTERM that comes while the dump is written is said, and waits for it."""
    rec = _recording
    if number == signal.SIGTERM:
        if _Termination.dumping and not _Termination.dumped:
            os.write(2, b"replay: capture: SIGTERM again while the flight recording is written: it is finished "
                        b"first, then the process ends\n")  # no print: the main thread may be inside one
            return
        if _Termination.dumped or rec is None or rec.ring is None:
            previous = _previous_handlers.pop(number, signal.SIG_DFL)
            signal.signal(number, previous if previous is not None else signal.SIG_DFL)
            os.kill(os.getpid(), number)
            return
        _Termination.dumping = True
    elif rec is None or rec.ring is None:  # the recording ended where no handler could be put back
        return
    threading.Thread(target=_dump_on_signal, args=(rec, number), name="replay-flight-dump", daemon=True).start()


def _dump_on_signal(rec: Recording, number: int) -> None:
    try:
        rec.dump()
    finally:
        if number == signal.SIGTERM:
            stop()
            _Termination.dumped = True
            os.kill(os.getpid(), number)  # back to _on_signal on the main thread, which may set handlers


@contextlib.contextmanager
def recording(path: str | Path, *, notes: str = "", tag_level: int | None = None, strict: bool | None = None,
              blob_threshold: int = BLOB_THRESHOLD_BYTES, chunk_threshold: int = CHUNK_THRESHOLD_BYTES,
              asynchronous: bool = True,
              queue_depth: int = DEFAULT_QUEUE_DEPTH, when_full: str = "block",
              durability: str = "close", ring: int | None = None,
              ring_bytes: int = DEFAULT_RING_BYTES) -> Iterator[Recording]:
    """Record every call of a registered or captured function made inside the block.

    A call's inputs are copied before it runs and its outputs, tags and launch records after
    (on a GPU, stream-ordered into pinned host memory); writer threads turn the copies into
    files, so the program pays for issuing copies, not for writing. Leaving the block, by an
    exception too, writes every call made in it. Capture errors are reported once on stderr
    and in the manifest, and never stop the program unless `strict`.

    Args:
        path: a new or empty directory for the snapshot. A directory that already holds
            a snapshot (or one being recorded) or calls of one, a regular file, or an
            unwritable place raises SnapshotError.
        notes: free text kept in the manifest.
        tag_level: 0 (no tags), 1 (level-1 tags) or 2 (all); default REPLAY_TAGS, else 1.
        strict: raise CaptureError on a capture failure, in the call that met it (strict
            capture writes on the calling thread); default REPLAY_CAPTURE_STRICT=1.
        blob_threshold: read-only tensors of at least this many bytes (weights) are
            stored once in blobs/, by content, and shared between calls.
        chunk_threshold: state and arguments the op mutates (a KV cache) of at least this
            many bytes are stored as 64 KiB pieces in blobs/, by content: a piece already
            stored (unchanged since the last call, or zeros) costs nothing. Snapshot format 2;
            a snapshot with no such tensor stays format 1.
        asynchronous: write on a thread of the recording's own (default); False writes each
            call before the program goes on.
        queue_depth: calls copied but not yet written, at most.
        when_full: with the queue full, "block" (the program waits; nothing is lost) or "drop"
            (the call is not recorded; the manifest's capture_errors counts and names the drops).
        durability: "close" flushes the files to disk once, when the recording closes (a
            killed process loses nothing: the page cache outlives it); "call" flushes each
            call's files as they are written, for runs that may lose power.
        ring: a flight recording: keep only the last `ring` calls, in host memory, and write
            them when an exception leaves the block, on SIGUSR1 (and go on), on SIGTERM (and
            exit) or on `replay.dump()`; a block left normally writes none.
        ring_bytes: the flight recording's budget of host memory for the calls it holds. A
            read-only input of `blob_threshold` bytes or more (inside a CUDA graph: one of 16 KiB
            or more from outside the graph) is held once as a blob, for every call that reads it,
            outside the budget: weights cost their size once, but a fresh large input at every
            call is not bounded by it.

    Returns:
        A context manager yielding the Recording (`.path`, `.calls_written`, `.flush()`).

    Example:
        with replay.recording("snapshots/prefill_001", notes="8-token prefill") as rec:
            model.prefill(tokens)
        print(rec.calls_written, "calls in", rec.path)
    """
    rec = start(path, notes=notes, tag_level=tag_level, strict=strict, blob_threshold=blob_threshold,
                chunk_threshold=chunk_threshold, asynchronous=asynchronous, queue_depth=queue_depth, when_full=when_full, durability=durability,
                ring=ring, ring_bytes=ring_bytes)
    try:
        yield rec
    except BaseException:
        rec.dump()  # a flight recording writes the calls that led here; any other has them already
        raise
    finally:
        stop()


def start_from_env() -> None:
    """Honour REPLAY_CAPTURE=path: record the whole process into that snapshot, written out at exit."""
    path = settings.CAPTURE.get()
    if not path or _recording is not None:
        return
    try:
        start(path)
        atexit.register(stop)
    except (ReplayError, OSError) as exc:  # an existing snapshot, an unwritable path, a bad setting
        if settings.CAPTURE_STRICT.get():
            raise
        print(f"replay: capture: {exc}; not recording", file=sys.stderr)


@dataclass(frozen=True)
class RowLimit:
    """A single-vector variant's guard: its parameter `name` holds one row along `axis`."""

    op: str
    name: str
    axis: int

    def check(self, value: Any) -> None:
        if isinstance(value, torch.Tensor) and value.dim() > self.axis and value.shape[self.axis] != 1:
            raise ValueError(f"{self.op} single: takes one row, got {value.shape[self.axis]}; use the batched variant")


def wrap(spec: CallSpec, fn: Callable, row_limit: RowLimit | None = None) -> Callable:
    """Wrap `fn` so calls are recorded while a recording is active (and verified while its op is),
    and, with `row_limit`, refused when they pass more than one row.

    With neither the wrapper costs one global read and a call (and the row check, one shape
    read): it is compiled with `fn`'s own parameters, so that nothing is packed into *args and
    **kwargs on the way."""
    signature = inspect.signature(fn)

    def run(*args: Any, **kwargs: Any) -> Any:
        rec = _recording  # read again: another thread may have stopped the recording meanwhile
        if rec is None:
            return fn(*args, **kwargs)
        return rec.record(spec, fn, signature, args, kwargs)

    def record(*args: Any, **kwargs: Any) -> Any:
        verifier = _verifiers.get(spec.op)
        if verifier is not None and spec.variant != "reference":
            return verifier(spec, run, signature, args, kwargs)
        return run(*args, **kwargs)

    captured = functools.wraps(fn)(_fast_path(fn, signature, record, row_limit) or _limited(record, signature,
                                                                                          row_limit))
    captured.__replay_spec__ = spec
    return captured


def _limited(record: Callable, signature: inspect.Signature, row_limit: RowLimit | None) -> Callable:
    """`record` with the row check done on its bound arguments, where no wrapper could be compiled."""
    if row_limit is None:
        return record

    def limited(*args: Any, **kwargs: Any) -> Any:
        try:
            row_limit.check(signature.bind(*args, **kwargs).arguments.get(row_limit.name))
        except TypeError:  # the call itself is wrong: let the function raise its own error
            pass
        return record(*args, **kwargs)
    return limited


_FAST_PREFIX = "_replay_"
_replay_Tensor = torch.Tensor  # what a compiled row check tests against (read from this module's globals)


def _fast_path(fn: Callable, signature: inspect.Signature, record: Callable,
               row_limit: RowLimit | None = None) -> Callable | None:
    """A function with `fn`'s parameters that calls `fn` while nothing intercepts calls and
    `record` otherwise, checking `row_limit` first (inline: a shape read); None where the
    parameters cannot be written out again, or may not be what `fn` takes (a decorated function:
    its signature is its wrapped one's; a partial; an object)."""
    if not inspect.isfunction(fn) or hasattr(fn, "__wrapped__"):
        return None
    params, passed, defaults = [], [], {}
    kinds = inspect.Parameter
    for i, p in enumerate(signature.parameters.values()):
        if p.name.startswith(_FAST_PREFIX) or p.name == "_intercepting" or not p.name.isidentifier():
            return None  # the names the compiled wrapper reads itself
        text = {kinds.VAR_POSITIONAL: f"*{p.name}", kinds.VAR_KEYWORD: f"**{p.name}"}.get(p.kind, p.name)
        if p.default is not p.empty:
            defaults[f"{_FAST_PREFIX}d{i}"] = p.default
            text += f"={_FAST_PREFIX}d{i}"
        if p.kind == kinds.KEYWORD_ONLY and not any(q.startswith("*") for q in params):
            params.append("*")
        params.append(text)
        if p.kind == kinds.POSITIONAL_ONLY and (i + 1 == len(signature.parameters) or
                                                list(signature.parameters.values())[i + 1].kind != p.kind):
            params.append("/")
        passed.append({kinds.VAR_POSITIONAL: f"*{p.name}", kinds.VAR_KEYWORD: f"**{p.name}",
                       kinds.KEYWORD_ONLY: f"{p.name}={p.name}"}.get(p.kind, p.name))
    arguments, call = ", ".join(params), ", ".join(passed)
    factory = ", ".join([f"{_FAST_PREFIX}fn", f"{_FAST_PREFIX}record", f"{_FAST_PREFIX}limit", *defaults])
    guard = ""
    if row_limit is not None:
        if row_limit.name not in signature.parameters:
            return None
        value, axis = row_limit.name, row_limit.axis
        guard = (f"        if isinstance({value}, {_FAST_PREFIX}Tensor) and {value}.dim() > {axis} "
                 f"and {value}.shape[{axis}] != 1:\n"
                 f"            {_FAST_PREFIX}limit.check({value})\n")
    source = (f"def {_FAST_PREFIX}make({factory}):\n"
              f"    def captured({arguments}):\n"
              f"{guard}"
              f"        if not _intercepting:\n"
              f"            return {_FAST_PREFIX}fn({call})\n"
              f"        return {_FAST_PREFIX}record({call})\n"
              f"    return captured\n")
    made: dict[str, Any] = {}
    exec(compile(source, f"<replay capture of {fn.__qualname__}>", "exec"), globals(), made)  # reads _intercepting live
    captured = made[f"{_FAST_PREFIX}make"](fn, record, row_limit, *defaults.values())
    # a wrong call's TypeError names the function, as the function itself would (co_qualname: 3.11 on)
    names = {"co_name": fn.__name__, **({"co_qualname": fn.__qualname__} if sys.version_info >= (3, 11) else {})}
    captured.__code__ = captured.__code__.replace(**names)
    return captured
