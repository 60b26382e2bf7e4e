"""A recording's life: started, routed to, flushed, dumped, stopped; signals; REPLAY_CAPTURE.

One recording is active at a time (`start`, `stop`, or `recording(...)` as a block). While a
recording is active or an op is verified (replay.verify), recorded calls are intercepted
(replay/recorder/intercept.py) and CUDA graphs' capture and replay are wrapped here, so that a
graph captured while recording is staged (replay/recorder/graphs.py) and recorded at each replay.
A recording writes what it holds on SIGTERM before the signal ends the process (a flight recording
also dumps on SIGUSR1 and goes on). Everything here calls down: the recording,
the interception, the graph staging.
"""
from __future__ import annotations

import logging
import atexit
import contextlib
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from replay import settings
from replay.ranks.layout import RankInfo, rank_from_env, rank_path
from replay.ranks.recording import CollectiveRecorder
from replay.recorder import graphs, intercept, stream_order
from replay.recorder.options import DEFAULT_RING_BYTES, DEFAULT_STATE_NAMES, RecordingOptions
from replay.recorder.session import Recording
from replay.context import recorder_work
from replay.errors import CaptureError, ReplayError
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from replay.torch_ops.recording import TorchOpRecorder, guarded
from replay.triton_launches import door
from replay.triton_launches.recording import LaunchRecorder

log = logging.getLogger(__name__)

_recording: Recording | None = None
_collectives: CollectiveRecorder | None = None  # torch.distributed's collectives, wrapped while recording
_verifiers: dict[str, Callable[..., Any]] = {}  # op name -> replay.verify's hook for its calls
_capture_hooks: list[Callable[[], object]] = []  # run before a CUDA graph capture begins (before_graph_capture)
_lock = threading.Lock()  # two threads starting recordings at once: one wins
# The writers share the interpreter lock with the program's threads, which let go of it in every torch
# operator and kernel launch and then wait to take it back: a writer's Python keeps it up to the switch
# interval (5 ms by default) before it must hand it over. While writers run, the interval is at most
# this (docs/PERFORMANCE.md, "The writers' hold on the interpreter lock").
SWITCH_INTERVAL_S = 0.0003
_interval_before: tuple[float, float] | None = None  # (the program's interval, the one set) while shortened


def active() -> Recording | None:
    return _recording


def start(path: str | Path, options: RecordingOptions = RecordingOptions()) -> Recording:
    """Start recording every recorded call into a new snapshot at `path`; one rank of several
    (torchrun's RANK and WORLD_SIZE) records into `path`/rank-<r>/ (replay/ranks/layout.py)."""
    global _recording
    with _lock:
        if _recording is not None:
            raise CaptureError(f"{path}: a recording into {_recording.path} is already active")
        rank = rank_from_env()
        _recording = Recording(rank_path(path, rank.rank) if rank is not None else path, options)
        if rank is not None:
            _recording.writer.set_manifest_field("distributed", rank.to_json())
        _record_collectives(_recording, rank)
        if options.torch_ops:
            _start_torch_ops(_recording, options)
        _route()
        if options.triton:
            door.install(LaunchRecorder(_recording, options))
        if torch.cuda.is_available():
            stream_order.install(_recording.clocks)
        _install_signal_handlers(flight=_recording.ring is not None)
        if _recording.calls.threaded:
            _shorten_switch_interval()
        return _recording


def stop() -> Recording | None:
    """Stop the active recording, if any: write what is queued, flush it to disk, and return it."""
    global _recording
    with _lock:
        rec, _recording = _recording, None
        _route()
        _stop_collectives()
        door.uninstall()
        stream_order.uninstall()
        _stop_torch_ops(rec)
    if rec is not None:
        _restore_signal_handlers()
        rec.close()
        _restore_switch_interval()
    return rec


def _shorten_switch_interval() -> None:
    global _interval_before
    before = sys.getswitchinterval()
    if before > SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        _interval_before = (before, sys.getswitchinterval())


def _restore_switch_interval() -> None:
    """The program's interval again, unless it set one of its own meanwhile."""
    global _interval_before
    if _interval_before is not None and sys.getswitchinterval() == _interval_before[1]:
        sys.setswitchinterval(_interval_before[0])
    _interval_before = None


def _record_collectives(rec: Recording, rank: RankInfo | None) -> None:
    global _collectives
    if torch.distributed.is_available():
        _collectives = CollectiveRecorder(rec, rank)
        _collectives.install()


def _stop_collectives() -> None:
    global _collectives
    if _collectives is not None:
        _collectives.uninstall()
        _collectives = None


def _start_torch_ops(rec: Recording, options: RecordingOptions) -> None:
    """Record operator calls on this thread; the recording's own operators (its copies, the
    functions it records) kept out, by marking its entry points."""
    rec.record = guarded(rec.record)  # type: ignore[method-assign]
    rec.record_replay = guarded(rec.record_replay)  # type: ignore[method-assign]
    rec.torch_ops = TorchOpRecorder(rec, options)
    rec.torch_ops.__enter__()


def _stop_torch_ops(rec: Recording | None) -> None:
    if rec is None or rec.torch_ops is None:
        return
    mode, rec.torch_ops = rec.torch_ops, None
    mode.on = False  # inert from now on, wherever it is
    stack = _get_current_dispatch_mode_stack()
    if threading.get_ident() == mode.thread and stack and stack[-1] is mode:
        mode.__exit__(None, None, None)
    else:  # stopped from another thread, or a mode the program pushed sits above it: left, inert
        log.warning("replay: capture: the torch-op recording stopped where its dispatch mode could not be "
                    "popped (another thread, or a mode pushed after it); it stays on that thread's stack, "
                    "recording nothing (torch.compile sees it there): stop a --torch-ops recording on the "
                    "thread that started it")


def set_verifier(op: str, hook: Callable[..., Any] | None) -> None:
    """Route the recorded calls of `op` through `hook` (replay.verify), or no longer (None)."""
    with _lock:
        if hook is None:
            _verifiers.pop(op, None)
        else:
            _verifiers[op] = hook
        _route()


def _route() -> None:
    intercept.route(_recording, _verifiers)
    if _recording is not None or _verifiers:
        _wrap_graphs()
    else:
        _unwrap_graphs()


def before_graph_capture(hook: Callable[[], object]) -> None:
    """Run `hook` before a CUDA graph capture begins while calls are intercepted (the verifier
    drains its checks: a CUDA call on its worker thread would break the capture)."""
    _capture_hooks.append(hook)


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


@contextlib.contextmanager
def recording(path: str | Path, **options: Any) -> Iterator[Recording]:
    """Record every call of a registered or captured function made inside the block, and every
    Triton kernel launch made outside them.

    A call's inputs are copied before it runs and its outputs, tags and launch records after
    (on a GPU, stream-ordered into pinned host memory); writer threads turn the copies into
    files, so the program pays for issuing copies, not for writing. Leaving the block, by an
    exception too, writes every call made in it. Capture errors are reported once on stderr
    and in the manifest, and never stop the program unless `strict`.

    Args:
        path: a new or empty directory for the snapshot. A directory that already holds
            a snapshot (or one being recorded) or calls of one, a regular file, or an
            unwritable place raises SnapshotError.
        **options: those of RecordingOptions (replay/recorder/options.py, each explained there):
            notes, tag_level, strict, blob_threshold, chunk_threshold, asynchronous, queue_depth,
            when_full ("block" or "drop"), durability ("close" or "call"), segment_bytes and
            segment_seconds (when a file of many calls is closed), ring (a flight
            recording of the last N calls), ring_bytes; triton (every Triton launch outside a
            recorded call is a call: on by default), only, skip, calls, steps, state_names;
            max_bytes (stop once the recorded calls hold this many bytes).

    Returns:
        A context manager yielding the Recording (`.path`, `.calls_written`, `.flush()`).

    Example:
        with replay.recording("snapshots/prefill_001", notes="8-token prefill") as rec:
            model.prefill(tokens)
        print(rec.calls_written, "calls in", rec.path)
    """
    rec = start(path, RecordingOptions(**options))
    try:
        yield rec
    except BaseException:
        rec.dump()  # a flight recording writes the calls that led here; any other has them already
        raise
    finally:
        stop()


def start_from_env() -> None:
    """Honour REPLAY_CAPTURE=path: record the whole process into that snapshot, written out at exit."""
    if _recording is not None:
        return
    try:
        path = settings.CAPTURE.get()
        if not path:
            return
        options = options_from_env()
        start(path, options)
        atexit.register(stop)
        if options.ring is not None:  # a program left unchanged has no block to leave by an exception
            sys.excepthook = _dumping_first(sys.excepthook)
    except (ReplayError, OSError) as exc:  # an existing snapshot, an unwritable path, a bad setting
        if settings.CAPTURE_STRICT.get():
            raise
        log.warning(f"replay: capture: {exc}; not recording")


def options_from_env() -> RecordingOptions:
    """The options REPLAY_CAPTURE_* set (README lists them)."""
    return RecordingOptions(triton=settings.CAPTURE_TRITON.get(), only=settings.CAPTURE_ONLY.get(),
                            skip=settings.CAPTURE_SKIP.get(), calls=settings.CAPTURE_CALLS.get(),
                            steps=settings.CAPTURE_STEPS.get(),
                            state_names=DEFAULT_STATE_NAMES + settings.CAPTURE_STATE.get(),
                            max_bytes=settings.CAPTURE_MAX_BYTES.get(), torch_ops=settings.CAPTURE_TORCH_OPS.get(),
                            ring=settings.CAPTURE_RING.get() or None,
                            ring_bytes=settings.CAPTURE_RING_BYTES.get() or DEFAULT_RING_BYTES)


def _dumping_first(previous: Callable[..., Any]) -> Callable[..., Any]:
    """An excepthook that writes what a flight recording holds, then does what `previous` did
    (print the traceback): the calls that led to the uncaught exception, on disk."""
    def hook(kind: type[BaseException], value: BaseException, trace: Any) -> None:
        try:
            dump()
        finally:
            previous(kind, value, trace)
    return hook


# CUDA graphs ------------------------------------------------------------------------------------

_graph_methods: dict[str, Callable[..., Any]] = {}  # CUDAGraph's own, while wrapped


def graph_method(name: str) -> Callable[..., Any]:
    """CUDAGraph's own `name` ("capture_begin", "capture_end", "replay"), not the wrapper that
    follows a capture for a recording: for graphs of the recorder's and verifier's own."""
    return _graph_methods.get(name) or getattr(torch.cuda.CUDAGraph, name)


def _wrap_graphs() -> None:
    """Wrap CUDAGraph's capture and replay: a capture is followed while a recording is active
    (background CUDA work is stopped first: a CUDA call on another thread breaks a capture in the
    default, global mode), and each replay of a followed graph is recorded."""
    if _graph_methods or not torch.cuda.is_available():
        return
    graph_class = torch.cuda.CUDAGraph
    begin, end, replay = graph_class.capture_begin, graph_class.capture_end, graph_class.replay
    _graph_methods.update(capture_begin=begin, capture_end=end, replay=replay)

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> None:
        rec = _recording
        if rec is not None:
            rec.flush()
        for hook in _capture_hooks:
            hook()
        # before it begins: reading the allocator's segments, compiling the copy kernel are not capturable
        with recorder_work():  # its allocations and warm-up launches are no calls of the program's
            graphs.begin(follow=rec is not None, ring=rec.device_ring_plan() if rec is not None else None)
        try:
            begin(self, *args, **kwargs)
        except BaseException:
            graphs.end()
            raise

    def capture_end(self: Any) -> None:
        capture = graphs.end()
        recorded = capture is not None
        try:
            if capture is not None:
                capture.finish()  # the last copies go into the graph before it closes
        except Exception as exc:  # the program's capture must still end; its replays go unrecorded
            assert capture is not None  # only finish() raises
            log.warning(f"replay: capture: CUDA graph {capture.tape.graph_id}: staging failed: {exc}; "
                        "its replays are not recorded")
            recorded = False
        end(self)
        if capture is not None:
            with recorder_work():
                capture.filled()  # the copies already in the graph read their tables at every replay
            graphs.keep(self, capture.tape, recorded)  # its memory lives with the graph either way

    def replay_and_record(self: Any) -> None:
        rec, tape = _recording, graphs.tape_of(self)
        if rec is None or tape is None:
            replay(self)
            if rec is not None:
                rec.record_replay(tape)
            return
        with tape.lock:  # a dump reading the graph's device ring sees replays and their count agree
            replay(self)
            rec.record_replay(tape)

    # setattr, as _unwrap_graphs puts them back: the checker allows no assignment to a class's methods
    for name, method in (("capture_begin", capture_begin), ("capture_end", capture_end), ("replay", replay_and_record)):
        setattr(graph_class, name, method)


def _unwrap_graphs() -> None:
    for name, original in _graph_methods.items():
        setattr(torch.cuda.CUDAGraph, name, original)
    _graph_methods.clear()


# signals of a flight recording -------------------------------------------------------------------

_FLIGHT_SIGNALS = tuple(s for s in (getattr(signal, "SIGUSR1", None), signal.SIGTERM) if s is not None)
_previous_handlers: dict[int, Any] = {}


class _Termination:
    """Where a SIGTERM's writing stands: a second SIGTERM during it does not cut it short."""

    dumping = False  # the dump thread runs
    dumped = False  # it is done: the next SIGTERM (its own) goes to the handler there was before
    pid = 0  # the process whose recording the handlers serve (a forked child's signals are passed on)


def _install_signal_handlers(flight: bool) -> None:
    """SIGTERM writes the calls a recording holds (a flight recording: dumps them), closes it and
    lets the signal do what it did before (by default, end the process): a job scheduler's or a
    timeout's polite kill loses nothing. SIGUSR1 dumps a `flight` recording and goes on. Only the
    main thread may set handlers: elsewhere dump(), close() at exit and an exception leaving the
    block still write."""
    if threading.current_thread() is threading.main_thread():
        _Termination.dumping = _Termination.dumped = False  # a new recording: none written on a signal yet
        _Termination.pid = os.getpid()
        for number in _FLIGHT_SIGNALS if flight else (signal.SIGTERM,):
            if signal.getsignal(number) is not signal.SIG_IGN:  # a program that ignores it goes on ignoring it
                _previous_handlers[number] = signal.signal(number, _on_signal)


def _restore_signal_handlers() -> None:
    """The handlers there were before ours, where ours are still set: one the program set while
    recording is its own, and stays."""
    if threading.current_thread() is threading.main_thread():
        while _previous_handlers:
            number, previous = _previous_handlers.popitem()
            if signal.getsignal(number) is _on_signal:
                signal.signal(number, previous if previous is not None else signal.SIG_DFL)


def _on_signal(number: int, frame: Any) -> None:
    """Runs on the main thread between two bytecodes, maybe while it holds a lock the writer needs:
    it waits for nothing. The work happens on a thread of its own; for SIGTERM that thread sends
    the signal again once the calls are on disk, and this handler passes it on to the handler
    there was before. A SIGTERM that comes while they are written is said, and waits for them."""
    rec = _recording
    if os.getpid() != _Termination.pid:  # a forked child (a DataLoader's worker): the recording is its parent's
        _pass_on(number)
        return
    if number == signal.SIGTERM:
        if _Termination.dumping and not _Termination.dumped:
            # written straight to stderr: a handler may not take the logging lock the main thread may hold
            os.write(2, b"replay: capture: SIGTERM again while the recording is written: it is finished "
                        b"first, then the process ends\n")
            return
        if _Termination.dumped or rec is None:
            _pass_on(number)
            return
        _Termination.dumping = True
    elif rec is None or rec.ring is None:  # the recording ended where no handler could be put back
        return
    threading.Thread(target=_dump_on_signal, args=(rec, number), name="replay-on-signal", daemon=True).start()


def _pass_on(number: int) -> None:
    """The signal to the handler there was before ours (by default, SIGTERM ends the process)."""
    previous = _previous_handlers.pop(number, signal.SIG_DFL)
    signal.signal(number, previous if previous is not None else signal.SIG_DFL)
    os.kill(os.getpid(), number)


def _dump_on_signal(rec: Recording, number: int) -> None:
    try:
        rec.dump()
    finally:
        if number == signal.SIGTERM:
            stop()
            _Termination.dumped = True
            os.kill(os.getpid(), number)  # back to _on_signal on the main thread, which may set handlers


