"""Capture costs: the no-recording overhead of a captured function, weight dedup on disk, and
(with --gpu) recording throughput on a GPU.

    python scripts/bench_capture.py [--iterations N] [--repeats R] [--layers L] [--steps S]
    PYTHONPATH=. python3 scripts/bench_capture.py --gpu      # on a GPU machine: (c) only
    PYTHONPATH=. python3 scripts/bench_capture.py --gpu --profile 'tiny h256: decode 16 steps'

(a) Calls a captured function with no recording active and the same undecorated function,
    N calls per timing, R timings each, and reports the median ns per call (the wrapper checks
    one global and calls the function).
(b) Records a toy decoder (L layers x S decode steps, three calls per layer, every layer's
    weights passed again at every step) and compares the bytes on disk with the bytes
    the recorded tensors would take stored inline in every call.
(d) Records a decode loop that writes one 64 KiB position per step into a 64 MiB cache (32
    steps; the cache is stored in 64 KiB content-addressed chunks), alone and with a read of the
    positions written after each write (as attention reads the cache), and compares the bytes on
    disk with the bytes the steps changed, and the time with the loop alone.
(c) --gpu: the tiny model (hidden 256 and 2048: a 64-token prefill, a 16-step decode loop),
    a 7B-shaped MLP block (bf16, 64 rows, 8 times) and an eager decode loop writing a 64 KiB
    position a step into a 64 MiB cache (stored in chunks), alone and with a read of the positions
    written after each write, each run bare, recorded through the
    pipeline (the default) and as a flight recording of the last 64 calls; the time until the
    recording is closed against its floor, the largest of the bare run, a pinned
    device-to-host copy of the bytes written and a sequential disk write of them (both rates
    measured in the same run). Each time is the median of --runs, after one untimed recording
    (which compiles the recorder's own kernel and fills its pools). The decode loop runs its
    CUDA graph, recorded or not; its eager time is given too. Then the flight recorder in
    steady state: a step of the graph decode loop after the graph is captured, bare and
    recorded into a ring, against the floor of one device-to-host copy of the bytes a replay
    stages. --profile: where the program's time goes.
Prints Markdown tables (pasted into docs/PERFORMANCE.md).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import platform
import shutil
import statistics
import tempfile
import time
import timeit
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import torch

import replay
from replay.snapshot import Snapshot

if TYPE_CHECKING:
    from replay_kernels.model import TinyLlama

HIDDEN = 256


def median_ns_per_call(fn: Callable[[], object], iterations: int, repeats: int) -> float:
    timings = timeit.repeat(fn, number=iterations, repeat=repeats)
    return statistics.median(timings) / iterations * 1e9


def overhead_rows(iterations: int, repeats: int) -> list[tuple[str, float, float]]:
    """(workload, plain, captured) in ns/call, no recording active."""
    def noop(x: object, y: object) -> object:
        return x

    def small_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.add(x, y)

    a, b = torch.randn(1, 1024), torch.randn(1, 1024)
    rows = []
    for label, fn in (("python no-op (x, y) -> x", noop), ("torch.add, 1024 fp32", small_add)):
        captured = replay.capture(f"bench_{fn.__name__}")(fn)  # what users call: the recorder's wrapper
        rows.append((label, median_ns_per_call(lambda: fn(a, b), iterations, repeats),
                     median_ns_per_call(lambda: captured(a, b), iterations, repeats)))
    # a single-vector variant also checks that it is handed one row (one shape read)
    single = replay.op("bench_rows", batch_axes={"x": 0}).single(noop)
    rows.append(("python no-op, as an op's single variant", median_ns_per_call(lambda: noop(a, b), iterations, repeats),
                 median_ns_per_call(lambda: single(a, b), iterations, repeats)))
    return rows


@replay.capture("bench_rmsnorm")
def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * (x.float().pow(2).mean(-1, keepdim=True) + eps).rsqrt().to(x.dtype) * weight


@replay.capture("bench_linear")
def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x @ weight.t()


def run_decoder(layers: int, steps: int, record_into: Path | None = None) -> float:
    """Run the toy decoder (recording it into `record_into` if given); return the seconds it took."""
    gen = torch.Generator().manual_seed(0)
    norms = [torch.rand(HIDDEN, generator=gen).half() for _ in range(layers)]
    w_in = [torch.randn(HIDDEN * 2, HIDDEN, generator=gen).half() * 0.05 for _ in range(layers)]
    w_out = [torch.randn(HIDDEN, HIDDEN * 2, generator=gen).half() * 0.05 for _ in range(layers)]
    x = torch.randn(1, HIDDEN, generator=gen).half()
    with replay.recording(record_into, notes="bench_capture") if record_into else contextlib.nullcontext():
        started = time.perf_counter()  # after the recording started: its one-off setup is not per call
        for _ in range(steps):
            for layer in range(layers):
                h = linear(rmsnorm(x, norms[layer]), w_in[layer])
                x = x + linear(h.relu(), w_out[layer])
        return time.perf_counter() - started


def dedup_figures(path: Path) -> dict[str, float]:
    snapshot = Snapshot(path)
    inline_bytes = references = 0
    for record in snapshot:
        inline_bytes += sum(t.numel() * t.element_size() for t in record.tensors.values())
        references += len(record.blobs)
    files = [f for f in path.rglob("*") if f.is_file()]
    return {"calls": len(snapshot), "inline_bytes": inline_bytes,
            "disk_bytes": sum(f.stat().st_size for f in files),
            "blob_files": len(list((path / "blobs").iterdir())), "blob_references": references}


def d2h_gbps(nbytes: int = 1 << 30) -> float:
    """GB/s of one device-to-host copy into pinned memory (median of 5)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    times = []
    for _ in range(5):
        torch.cuda.synchronize()
        started = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return nbytes / statistics.median(times) / 1e9


def disk_gbps(directory: Path, nbytes: int = 1 << 30, piece: int = 64 << 20) -> float:
    """GB/s of writing a new file in `piece`-sized writes, flushed to disk at the end, as the pipeline does."""
    data = os.urandom(piece)
    target = directory / "disk_probe.bin"
    started = time.perf_counter()
    with open(target, "wb") as f:
        for _ in range(nbytes // piece):
            f.write(data)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - started
    target.unlink()
    return nbytes / seconds / 1e9


@replay.capture("bench_mlp_up")
def mlp_up(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(x @ w_gate.t()) * (x @ w_up.t())


Workload = tuple[Callable[[], object], Callable[[bool], None] | None]  # the run, and a switch of its CUDA graph
TINY_SHAPES = {256: (768, 4, 2), 2048: (5632, 16, 4)}  # hidden: ffn, heads, kv heads
# the flight recorder's models: (hidden, layers); the deeper one shows what a graph's copy
# launches cost a layer (each layer's KV cache is written in the graph)
FLIGHT_MODELS = ((256, 2), (2048, 2), (256, 16))


def tiny_model(hidden: int, layers: int = 2) -> TinyLlama:
    from replay_kernels.model import TinyLlama, TinyLlamaConfig

    ffn, heads, kv_heads = TINY_SHAPES[hidden]
    return TinyLlama(TinyLlamaConfig(hidden=hidden, ffn=ffn, heads=heads, kv_heads=kv_heads, max_seq=128,
                                     layers=layers), device="cuda")


def gpu_workloads() -> dict[str, Workload]:
    work: dict[str, Workload] = {}
    for hidden in TINY_SHAPES:
        model = tiny_model(hidden)

        def prefill(model: TinyLlama = model) -> object:
            model.reset()
            return model.prefill(list(range(64)))

        def decode(model: TinyLlama = model) -> object:
            model.reset()
            model.prefill(list(range(8)))
            return [model.decode_step(t) for t in range(16)]

        def use_graph(on: bool, model: TinyLlama = model) -> None:
            model.use_cuda_graph = on
        work[f"tiny h{hidden}: prefill 64"] = (prefill, None)
        work[f"tiny h{hidden}: decode 16 steps"] = (decode, use_graph)
    gen = torch.Generator(device="cuda").manual_seed(0)
    w_gate, w_up = (torch.randn(11008, 4096, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(2))
    w_down = torch.randn(4096, 11008, device="cuda", generator=gen, dtype=torch.bfloat16)
    x = torch.randn(64, 4096, device="cuda", generator=gen, dtype=torch.bfloat16)
    work["7B MLP block, 64 rows x 8"] = (lambda: [linear(mlp_up(x, w_gate, w_up), w_down) for _ in range(8)], None)
    cache = torch.zeros(1024, 16384, device="cuda")  # 64 MiB, a position's 64 KiB contiguous
    rows = [torch.full((16384,), float(step + 1), device="cuda") for step in range(32)]
    work["eager decode, 64 MiB cache, 32 steps"] = (cache_decode(cache, rows, read=False), None)
    # and a read of the positions written after each write, as attention does
    work["eager decode and reads, 64 MiB cache, 32 steps"] = (cache_decode(cache, rows, read=True), None)
    # a cache past the staging budget (chunk_changes.DEVICE_STAGING_BYTES, 4 GiB), as an engine's KV cache
    # of many GB: its stores stage their changed pieces packed. Made at its first run, so that the
    # other workloads run without it resident
    large = functools.cache(lambda: torch.zeros(81920, 16384, device="cuda"))
    work["eager decode, 5 GiB cache, 8 steps"] = (cache_decode(large, rows[:8], read=False), None)
    return work


def cache_decode(cache: torch.Tensor | Callable[[], torch.Tensor], rows: list[torch.Tensor],
                 read: bool) -> Callable[[], object]:
    """decode_steps from an empty cache each run (or the one `cache()` makes): every step changes
    64 KiB of it."""
    def run() -> object:
        written = cache if isinstance(cache, torch.Tensor) else cache()
        written.zero_()
        return decode_steps(written, rows, read)
    return run


def timed(fn: Callable[[], object], record_into: Path | None, runs: int,
          **options: object) -> tuple[float, float, int, int]:
    """Median (program seconds, seconds until the recording is closed) over `runs`, and the bytes
    and the number of files (calls, blobs, chunks) on disk."""
    program, total, size, files = [], [], 0, 0
    for run in range(runs):
        target = record_into / str(run) if record_into else None
        torch.cuda.synchronize()
        started = time.perf_counter()
        with replay.recording(target, **options) if target else contextlib.nullcontext():
            fn()
            torch.cuda.synchronize()
            program.append(time.perf_counter() - started)
        total.append(time.perf_counter() - started)
        if target:
            written = [f for f in target.rglob("*") if f.is_file()]
            size = sum(f.stat().st_size for f in written)
            files = sum(1 for f in written if f.suffix == ".safetensors")
            shutil.rmtree(target)
    return statistics.median(program), statistics.median(total), size, files


def gpu_table(runs: int, only: str = "") -> None:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        d2h, disk = d2h_gbps(), disk_gbps(Path(tmp))
        print(f"{torch.cuda.get_device_name()}; pinned device-to-host {d2h:.1f} GB/s; disk write ({tmp}) "
              f"{disk:.2f} GB/s\n")
        print("| workload | bare ms (eager) | recorded: program ms / closed ms | MB written (files) "
              "| floor ms: max(bare, D2H, disk) | closed / floor | flight recorder, ring=64 ms (x bare; x eager) |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name, (fn, use_graph) in gpu_workloads().items():
            if only not in name:
                continue
            fn()  # compile the kernels (and capture the CUDA graph)
            bare = eager = timed(fn, None, runs)[0]
            if use_graph is not None:  # the eager loop's time too
                use_graph(False)
                fn()
                eager = timed(fn, None, runs)[0]
                use_graph(True)
            # a first recording, untimed, compiles the recorder's own kernels (piece checksums) and
            # fills its pools, as the call above compiled the program's
            timed(fn, Path(tmp) / "warm", 1)
            program, closed, size, files = timed(fn, Path(tmp) / "pipe", runs)
            timed(fn, Path(tmp) / "warm", 1, ring=64)
            flight = timed(fn, Path(tmp) / "ring", runs, ring=64)[1]
            floor = max(bare, size / d2h / 1e9, size / disk / 1e9)
            print(f"| {name} | {bare * 1e3:.1f}" + (f" ({eager * 1e3:.1f})" if eager != bare else "")
                  + f" | {program * 1e3:.1f} / {closed * 1e3:.1f} | {size / 1e6:.0f} ({files}) "
                  f"| {floor * 1e3:.1f} | {closed / floor:.2f}x "
                  f"| {flight * 1e3:.1f} ({flight / bare:.2f}x; {flight / eager:.2f}x) |", flush=True)
    if not only or "flight" in only:
        flight_table(runs)


def copy_us(nbytes: int, repeats: int = 50) -> float:
    """Microseconds of one device-to-host copy of `nbytes` into pinned memory, back to back."""
    src = torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda")
    dst = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    dst.copy_(src, non_blocking=True)
    start.record()
    for _ in range(repeats):
        dst.copy_(src, non_blocking=True)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / repeats


def steady_decode(model: TinyLlama, steps: int, ring: Path | None) -> tuple[float, float, int]:
    """Seconds a step of the tiny model's graph decode loop, timed after the graph is captured
    (recorded into a flight recording when `ring` is given); seconds a replay of its graph alone
    (nothing recorded, back to back: the graph's own cost, staging copies included); the bytes a
    replay stages."""
    from replay.recorder import graphs, lifecycle

    with replay.recording(ring, ring=64) if ring else contextlib.nullcontext():
        model.reset()
        model.prefill(list(range(8)))
        model.decode_step(0)  # captures the graph (anew under a recording)
        model.decode_step(1)
        torch.cuda.synchronize()
        started = time.perf_counter()
        for token in range(steps):
            model.decode_step(token)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / steps
        graph, tape = model._graph, graphs.tape_of(model._graph)
        replay_only = lifecycle._graph_methods.get("replay", torch.cuda.CUDAGraph.replay)  # not recorded
        started = time.perf_counter()
        for _ in range(steps):
            replay_only(graph)
        torch.cuda.synchronize()
        graph_seconds = (time.perf_counter() - started) / steps
    return seconds, graph_seconds, sum(tape.used) if tape is not None else 0


def flight_table(runs: int, steps: int = 96) -> None:
    """The flight recorder in steady state: a step of the graph decode loop bare and recorded, the
    graph alone, and the floor of one host copy of what a replay stages."""
    print(f"\n| flight recorder, graph decode, {steps} steps after capture | bare us/step (graph alone) "
          "| ring=64 us/step (graph alone) | x bare | staged KB/replay | its D2H us | floor (x bare) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        for hidden, layers in FLIGHT_MODELS:
            model = tiny_model(hidden, layers)
            steady_decode(model, 4, None)  # compile
            bare = [steady_decode(model, steps, None) for _ in range(runs)]
            ring = [steady_decode(model, steps, Path(tmp) / f"ring{hidden}-{layers}-{run}") for run in range(runs)]
            (bare_step, bare_graph), (ring_step, ring_graph) = (
                (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows)) for rows in (bare, ring))
            staged = ring[0][2]
            floor = copy_us(staged) * 1e-6
            name = f"tiny h{hidden}" + (f", {layers} layers" if layers != 2 else "")
            print(f"| {name} | {bare_step * 1e6:.0f} ({bare_graph * 1e6:.0f}) "
                  f"| {ring_step * 1e6:.0f} ({ring_graph * 1e6:.0f}) | {ring_step / bare_step:.3f}x "
                  f"| {staged / 1e3:.0f} | {floor * 1e6:.1f} | {(bare_step + floor) / bare_step:.3f}x |", flush=True)


def gpu_profile(name: str, rows: int = 30) -> None:
    """Where the recorded program's own time goes: recorded as a flight recording, so that no writer
    thread runs (cProfile on Python 3.12 sees every thread)."""
    import cProfile
    import pstats

    fn = gpu_workloads()[name][0]
    fn()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        with replay.recording(Path(tmp) / "warm", ring=64):
            fn()
        profile = cProfile.Profile()
        with replay.recording(Path(tmp) / "snap", ring=64):
            profile.enable()
            fn()
            torch.cuda.synchronize()
            profile.disable()
    print(f"\nprofile of the program's thread, recording '{name}':")
    pstats.Stats(profile).sort_stats("tottime").print_stats(rows)


@replay.capture("bench_write_position", mutates=("cache",))
def write_position(cache: torch.Tensor, row: torch.Tensor, position: int) -> None:
    cache[position] = row


@replay.capture("bench_read_positions")
def read_positions(cache: torch.Tensor, positions: int) -> torch.Tensor:
    return cache[:positions].sum(dim=0)  # as a decode step's attention reads the cache it wrote to


def decode_steps(cache: torch.Tensor, rows: list[torch.Tensor], read: bool) -> None:
    """Write row n at position n of `cache` (and, with `read`, read the positions written so far after each write)."""
    for step, row in enumerate(rows):
        write_position(cache, row, step)
        if read:
            read_positions(cache, step + 1)


def chunked_decode(steps: int = 32, read: bool = False) -> dict[str, float]:
    """decode_steps into a 64 MiB cache, a 64 KiB position a step, bare and recorded."""
    cache = torch.zeros(1024, 16384)  # 64 MiB, a position's 64 KiB contiguous
    rows = [torch.full((16384,), float(step + 1)) for step in range(steps)]
    started = time.perf_counter()
    decode_steps(cache, rows, read)
    bare = time.perf_counter() - started
    cache.zero_()  # from an empty cache again: every recorded step changes 64 KiB of it
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        with replay.recording(Path(tmp) / "snap"):
            decode_steps(cache, rows, read)
        recorded = time.perf_counter() - started
        stored = [f for f in (Path(tmp) / "snap").rglob("*") if f.is_file()]
        written = sum(f.stat().st_size for f in stored)
    changed = sum(row.numel() * row.element_size() for row in rows)
    return {"steps": steps, "changed": changed, "written": written, "files": len(stored), "bare": bare,
            "recorded": recorded}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200_000, help="calls per timing")
    parser.add_argument("--repeats", type=int, default=7, help="timings per function (the median is reported)")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4, help="decode steps: each passes every weight again")
    parser.add_argument("--gpu", action="store_true", help="(c) only: recording throughput on the GPU")
    parser.add_argument("--runs", type=int, default=3, help="--gpu: runs per timing (the median is reported)")
    parser.add_argument("--only", metavar="TEXT", default="", help="--gpu: the workloads whose name holds TEXT "
                        "('flight': the flight recorder's steady state alone)")
    parser.add_argument("--profile", metavar="WORKLOAD", help="--gpu: profile the program side of recording one "
                        "workload (a name from the table, e.g. 'tiny h256: decode 16 steps') instead")
    args = parser.parse_args()
    if args.gpu:
        gpu_profile(args.profile) if args.profile else gpu_table(args.runs, args.only)
        return

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}\n")
    print("| workload (no recording active) | plain ns/call | captured ns/call (ratio) | extra ns/call |")
    print("| --- | ---: | ---: | ---: |")
    for label, plain_ns, captured_ns in overhead_rows(args.iterations, args.repeats):
        print(f"| {label} | {plain_ns:.0f} | {captured_ns:.0f} ({captured_ns / plain_ns:.2f}x) "
              f"| {captured_ns - plain_ns:.0f} |")

    plain_seconds = run_decoder(args.layers, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        seconds = run_decoder(args.layers, args.steps, record_into=Path(tmp) / "snap")
        f = dedup_figures(Path(tmp) / "snap")
    print(f"\n| recording ({args.layers} layers x {args.steps} steps x 3 calls, fp16, hidden {HIDDEN}) | value |")
    print("| --- | ---: |")
    print(f"| calls | {f['calls']} |")
    print(f"| tensor bytes recorded (every tensor inline in every call) | {f['inline_bytes'] / 2**20:.2f} MiB |")
    print(f"| bytes on disk (calls + blobs + index + manifest) | {f['disk_bytes'] / 2**20:.2f} MiB |")
    print(f"| blob files / blob references | {f['blob_files']} / {f['blob_references']} |")
    print(f"| saved by dedup | {1 - f['disk_bytes'] / f['inline_bytes']:.1%} "
          f"({f['inline_bytes'] / f['disk_bytes']:.2f}x smaller) |")
    print(f"| time: not recording / recording | {plain_seconds:.2f} s / {seconds:.2f} s "
          f"({(seconds - plain_seconds) / f['calls'] * 1e3:.2f} ms of capture per call) |")

    print("\n| decode loop, 32 steps over a 64 MiB cache (64 KiB chunks) | bytes the steps changed (the rows "
          "passed in) | bytes on disk (files) | x the changed bytes | time: not recording / recording, closed |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for read in (False, True):
        d = chunked_decode(read=read)
        print(f"| a write a step{', then a read of the positions written' if read else ''} "
              f"| {d['changed'] / 2**20:.2f} MiB | {d['written'] / 2**20:.2f} MiB ({d['files']}) "
              f"| {d['written'] / d['changed']:.2f}x | {d['bare'] * 1e3:.0f} ms / {d['recorded'] * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
