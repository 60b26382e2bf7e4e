"""Where a recording's steady-state step goes: Liger-Kernel's llama block (as scripts/bench_launches.py
runs it) recorded step after step, with the Python stacks of every thread sampled meanwhile.

    python scripts/profile_record.py                          # on a GPU: 2048 tokens, hidden 4096, bf16
    python scripts/profile_record.py --steps 12 --interval 0.5
    python scripts/profile_record.py --timers                 # the recorder's steps timed instead
    python scripts/profile_record.py --writer-timers          # the writers' steps timed: processor time a step
    python scripts/profile_record.py --census                 # the calls a recorded launch makes, counted
    python scripts/profile_record.py --timers --hold-writers --steps 5   # no writer takes the lock meanwhile

Printed: bare and recorded step times, how many stores of each kind a step makes (counted by
wrapping the Copier's methods), the Triton kernels compiled after the first recorded step (a
steady state compiles nothing: each compile costs a step tens of milliseconds), and, over the
later steps, the share of samples in which each function was on a thread's stack (inclusive) and
at its top (self), by kind of thread (the threads of a kind summed: two writers busy all the time
show 2.0). The program's thread and torch's autograd thread (where backward's launches are
recorded) are the ones that cost the program; the writers' and hashers' threads cost it only
through the interpreter lock. A sample is taken when the sampler gets the lock: a thread in a
long C call without releasing it is seen late. With `--timers`, instead of sampling, the
recorder's own steps are timed where they run (TIMED: wall time inclusive, per call and a step,
summed over threads), which says what a launch's recording costs the program piece by piece;
with `--writer-timers`, the writers' steps (WRITER_TIMED), whose processor time a step is what
they take from the cores, and whose Python holds the interpreter lock the program waits for.
With `--census`, every Python function and C function (torch's operators among them) that a
recorded launch calls on the thread that launches it, counted a launch, with times (inflated by
the profiler that counts them, so only their order means anything): unlike timings, the counts
are the same on every machine and run, so they show what a change to the recorder's path saved.
A diagnosis, not a benchmark: figures for docs/PERFORMANCE.md come from bench_launches.py.
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_launches  # noqa: E402  (the block and its inputs, loaded the same way)
import writers_held  # noqa: E402

STORES = ("copy", "copy_blob", "copy_chunked")
# (module, attribute path) of the recorder's steps timed by --timers, outermost first
TIMED = (
    ("replay.triton_launches.recording", "LaunchRecorder.launch"),
    ("replay.triton_launches.recording", "LaunchRecorder._describe"),
    ("replay.recorder.session", "Recording.record"),
    ("replay.recorder.staging", "arguments"),
    ("replay.recorder.staging", "outputs"),
    ("replay.recorder.session", "Recording._store"),
    ("replay.recorder.session", "Recording._store_before"),
    ("replay.recorder.session", "Recording.blob"),
    ("replay.recorder.session", "Recording._hand_over"),
    ("replay.recorder.copies", "Copier.copy_span"),
    ("replay.recorder.copies", "Copier._copy_through"),
    ("replay.recorder.copies", "Copier.copy_chunked"),
    ("replay.recorder.copies", "Copier.copy_blob"),
    ("replay.recorder.copies", "Copier.hold_before"),
    ("replay.recorder.copies", "Copier._copy_on_device"),
    ("replay.recorder.copies", "Copier.copy_unchanged"),
    ("replay.recorder.copies", "Copier.mark"),
    ("replay.recorder.chunk_changes", "PieceTracker._add"),
    ("replay.recorder.chunk_changes", "PieceTracker._reserve"),
    ("replay.recorder.copies", "storage_span"),
    ("replay.recorder.footprint", "StorageIds.of"),
    ("replay.recorder.chunk_changes", "_run"),
    ("replay.recorder.device_buffers", "DeviceBuffers.take"),
    ("replay.recorder.chunk_changes", "staging_buffer"),
    ("replay.recorder.piece_batch", "PieceBatch.add"),
    ("replay.recorder.chunk_changes", "PieceHistory.__post_init__"),
    ("replay.recorder.piece_batch", "PieceBatch.launch"),
    ("replay.recorder.piece_batch", "Checksums.__init__"),
    ("replay.recorder.piece_sums", "launch"),
    ("replay.direct_launch", "DirectLauncher.launch"),
    ("replay.driver_launch", "KernelLaunch.__call__"),
    ("replay.recorder.cuda_streams", "event_now"),
    ("replay.recorder.copies", "PinnedPool.take"),
    ("replay.recorder.stream_order", "current_stream"),
    ("replay.recorder.stream_order", "StreamClocks.issue"),
    ("replay.recorder.staging", "header"),
    ("replay.recorder.piece_batch", "Checksums.host"),
    ("replay.recorder.unchanged_bits", "unchanged_mask"),
    ("replay.recorder.pipeline", "CallWriter.submit"),
)
# the writers' steps, timed by --writer-timers where they run (writer threads; the program's thread
# when a flush writes a segment): what each costs a step in processor time
WRITER_TIMED = (
    ("replay.recorder.pipeline", "CallWriter._finish"),
    ("replay.recorder.pipeline", "CallWriter._call_part"),
    ("replay.recorder.pipeline", "CallWriter._put_chunks"),
    ("replay.recorder.pipeline", "CallWriter._write_segment"),
    ("replay.recorder.pipeline", "CallWriter.release"),
    ("replay.snapshot.writer", "SnapshotWriter.write_segment"),
    ("replay.snapshot.writer", "SnapshotWriter.add_to_index"),
    ("replay.snapshot.writer", "SnapshotWriter.put_pieces"),
    ("replay.snapshot.writer", "SnapshotWriter.put_blob"),
    ("replay.snapshot.writer", "write_atomic"),
    ("replay.recorder.chunk_changes", "PieceHistory.content_key"),
    ("replay.recorder.chunk_changes", "PieceHistory.stored_before"),
    ("replay.recorder.chunk_changes", "PieceHistory.hashed"),
    ("replay.recorder.piece_batch", "Checksums.host"),
    ("replay.recorder.copies", "BlobRef.resolve"),
    ("replay.recorder.copies", "HostCopy.unpin"),
    ("replay.recorder.repeats", "Repeats.known"),
    ("replay.snapshot.hashing", "piece_digests"),
    ("json", "dumps"),
)


class Census:
    """From `on` set, each LaunchRecorder.launch profiled on the thread that makes it (sys.setprofile
    is per thread): calls of each Python and C function counted, with inclusive and self times."""

    def __init__(self) -> None:
        from replay.triton_launches import recording

        self.on = threading.Event()
        self.launches = 0
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()
        self.self_ns: collections.Counter[tuple[str, str]] = collections.Counter()
        self.inclusive_ns: collections.Counter[tuple[str, str]] = collections.Counter()
        original = recording.LaunchRecorder.launch

        def launch(recorder: Any, *args: Any, **kwargs: Any) -> Any:
            if not self.on.is_set() or sys.getprofile() is not None:
                return original(recorder, *args, **kwargs)
            self.launches += 1
            sys.setprofile(self._profiler())
            try:
                return original(recorder, *args, **kwargs)
            finally:
                sys.setprofile(None)
        recording.LaunchRecorder.launch = launch  # type: ignore[method-assign]

    def _profiler(self) -> Any:
        stack: list[list[Any]] = []  # [function, started ns, its callees' ns]
        clock = time.perf_counter_ns

        def profile(frame: FrameType, event: str, arg: Any) -> None:
            now = clock()
            if event in ("call", "c_call"):
                stack.append([_function(frame, event, arg), now, 0])
            elif stack:
                function, started, callees = stack.pop()
                spent = now - started
                self.calls[function] += 1
                self.inclusive_ns[function] += spent
                self.self_ns[function] += spent - callees
                if stack:
                    stack[-1][2] += spent
        return profile

    def print(self, top: int) -> None:
        n = max(self.launches, 1)
        for kind, title in (("C", "C functions"), ("py", "Python functions")):
            total = sum(count for (k, _), count in self.calls.items() if k == kind)
            print(f"\n{title}: {total / n:.0f} calls a recorded launch ({self.launches} launches); the most costly "
                  "(calls a launch, self us and inclusive us a launch, as profiled)")
            rows = sorted((f for f in self.calls if f[0] == kind), key=lambda f: -self.self_ns[f])
            for function in rows[:top]:
                print(f"  {self.calls[function] / n:7.1f} {self.self_ns[function] / n / 1e3:8.1f} "
                      f"{self.inclusive_ns[function] / n / 1e3:9.1f}  {function[1]}")


def _function(frame: FrameType, event: str, arg: Any) -> tuple[str, str]:
    """('C', 'module.qualname') of a C function called, or ('py', 'folder/file.py:function')."""
    if event == "c_call":
        owner = getattr(arg, "__module__", None) or type(getattr(arg, "__self__", None)).__name__
        return "C", f"{owner}.{getattr(arg, '__qualname__', getattr(arg, '__name__', '?'))}"
    path = Path(frame.f_code.co_filename)
    return "py", f"{path.parent.name}/{path.name}:{frame.f_code.co_name}"


class Sampler:
    """Every `interval` seconds while on, each thread's stack: functions inclusive and at the top."""

    def __init__(self, interval: float):
        self.interval = interval
        self.samples = 0
        self.inclusive: collections.Counter[tuple[str, str]] = collections.Counter()
        self.top: collections.Counter[tuple[str, str]] = collections.Counter()
        self.on = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop:
            time.sleep(self.interval)
            if not self.on.is_set():
                continue
            names = {t.ident: t.name for t in threading.enumerate()}
            self.samples += 1
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    self._count(_thread_kind(names.get(ident, "?")), frame)

    def _count(self, thread: str, frame: FrameType) -> None:
        self.top[thread, _where(frame, line=True)] += 1
        seen = set()
        at: FrameType | None = frame
        while at is not None:
            seen.add(_where(at))
            at = at.f_back
        for where in seen:
            self.inclusive[thread, where] += 1

    def stop(self) -> None:
        self._stop = True
        self._thread.join()


def _thread_kind(name: str) -> str:
    """A thread's name without its number: writers and hashers each counted as one kind."""
    return name.rstrip("0123456789_-") or name


def _where(frame: FrameType, line: bool = False) -> str:
    where = f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
    return f"{where}:{frame.f_lineno}" if line else where


def count_stores() -> collections.Counter[str]:
    """How many stores of each kind the recording makes, counted from now."""
    from replay.recorder import copies

    counted: collections.Counter[str] = collections.Counter()
    for name in STORES:
        original = getattr(copies.Copier, name)

        def counting(self: Any, *args: Any, _original: Any = original, _name: str = name, **kwargs: Any) -> Any:
            counted[_name] += 1
            return _original(self, *args, **kwargs)
        setattr(copies.Copier, name, counting)
    return counted


def time_steps(steps: tuple[tuple[str, str], ...] = TIMED) -> dict[str, list[float]]:
    """From now on, each of `steps`' functions timed where it runs: name -> [calls, seconds, seconds
    of the thread's processor time] (wall time beyond processor time is waiting: for the GPU, a
    lock, the interpreter lock)."""
    import importlib

    timed: dict[str, list[float]] = {}
    for module_name, path in steps:
        owner: Any = importlib.import_module(module_name)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        totals = timed[path] = [0, 0.0, 0.0]

        def timing(*args: Any, _original: Any = original, _totals: list[float] = totals, **kwargs: Any) -> Any:
            started, processor = time.perf_counter(), time.thread_time()
            try:
                return _original(*args, **kwargs)
            finally:
                _totals[0] += 1
                _totals[1] += time.perf_counter() - started
                _totals[2] += time.thread_time() - processor
        setattr(owner, name, timing)
    return timed


def count_compiles(step: list[int]) -> collections.Counter[tuple[int, str]]:
    """Triton kernels compiled from now on, by the step (`step[0]`, read when each one is) and the
    kernel's specialisation as Triton writes it."""
    import triton

    compiled: collections.Counter[tuple[int, str]] = collections.Counter()

    def note(**kwargs: Any) -> None:  # Triton's hook: its return value is ignored after a compile
        compiled[step[0], str(kwargs.get("repr"))] += 1
    triton.knobs.runtime.jit_post_compile_hook = note
    return compiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_launches.add_shape(parser)
    parser.add_argument("--steps", type=int, default=12, help="recorded steps; the first two are not sampled")
    parser.add_argument("--interval", type=float, default=0.5, help="milliseconds between samples")
    parser.add_argument("--top", type=int, default=25, help="functions shown a table")
    parser.add_argument("--timers", action="store_true", help="time the recorder's steps (TIMED) instead of sampling")
    parser.add_argument("--writer-timers", action="store_true",
                        help="time the writers' steps (WRITER_TIMED) instead of sampling: processor time a step")
    parser.add_argument("--census", action="store_true",
                        help="count the calls each recorded launch makes (sys.setprofile) instead of sampling")
    parser.add_argument("--hold-writers", action="store_true",
                        help="hold the writers still over the profiled steps (at most 3: past them the pinned "
                             "pool and the device staging budget run dry and stores wait for writers that never "
                             "come), so that no wait for the interpreter lock they take blurs the program's own costs")
    args = parser.parse_args()
    if args.hold_writers and not 2 < args.steps <= 5:
        parser.error(f"--hold-writers: --steps {args.steps}: give 3 to 5 (two unprofiled, then up to three held)")

    import replay  # before Liger imports Triton: without a GPU, the interpreter

    going = writers_held.hold_writers() if args.hold_writers else None  # else the writers run untouched
    step = bench_launches.timed_step(args.shape)
    step()  # compiles every kernel
    print("bare ms:", " ".join(f"{step():.1f}" for _ in range(5)))
    counted = count_stores()
    at_step = [0]
    compiled = count_compiles(at_step)
    timed = time_steps(WRITER_TIMED if args.writer_timers else TIMED) if args.timers or args.writer_timers else {}
    census = Census() if args.census else None
    sampler = Sampler(args.interval / 1e3)
    times = []
    with replay.recording(Path(tempfile.mkdtemp()) / "profiled") as recording:
        for n in range(args.steps):
            at_step[0] = n
            if n == 2:  # after the first step's new bytes are written: the steady state
                if going is not None:
                    going.clear()
                counted.clear()
                for totals in timed.values():
                    totals[:] = [0, 0.0, 0.0]
                if census is not None:
                    census.on.set()
                elif not timed:
                    sampler.on.set()
            times.append(step())
            if n == 0:
                recording.flush()
        if going is not None:
            going.set()
        sampler.on.clear()
        if census is not None:
            census.on.clear()
    sampler.stop()
    sampled = max(1, args.steps - 2)
    print("recorded ms:", " ".join(f"{t:.1f}" for t in times))
    print("stores a step:", {name: round(counted[name] / sampled, 1) for name in STORES})
    later = sorted((n, where, count) for (n, where), count in compiled.items() if n > 0)
    print(f"Triton kernels compiled after the first recorded step: {sum(count for *_, count in later)}")
    for n, where, count in later[:args.top]:
        print(f"  step {n}: {count} x {where[:300]}")
    if census is not None:
        census.print(args.top)
        return
    if timed:
        print("recorder steps (inclusive: a step's time holds the steps it calls; summed over threads)")
        print(f"  {'calls a step':>12} {'us a call':>10} {'cpu us':>8} {'ms a step':>10} {'cpu ms a step':>14}  step")
        for path, (calls, seconds, processor) in timed.items():
            each, a_step = seconds / max(calls, 1) * 1e6, seconds / sampled * 1e3
            processor_each = processor / max(calls, 1) * 1e6
            print(f"  {calls / sampled:12.1f} {each:10.1f} {processor_each:8.1f} {a_step:10.2f} "
                  f"{processor / sampled * 1e3:14.2f}  {path}")
        return
    print(f"{sampler.samples} samples")
    for title, table in (("inclusive", sampler.inclusive), ("self", sampler.top)):
        for thread in sorted({thread for thread, _ in table}):
            rows = sorted(((n, where) for (t, where), n in table.items() if t == thread), reverse=True)
            print(f"\n{thread}, {title} (share of samples)")
            for n, where in rows[:args.top]:
                print(f"  {n / max(1, sampler.samples):6.3f}  {where}")


if __name__ == "__main__":
    main()
