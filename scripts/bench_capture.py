"""Capture costs: the no-recording overhead of a captured function, and weight dedup on disk.

    python scripts/bench_capture.py [--iterations N] [--repeats R] [--layers L] [--steps S]

(a) Calls a captured function with no recording active and the same undecorated function,
    N calls per timing, R timings each, and reports the median ns per call: for the
    recorder's wrapper alone and for the registry Variant that users call (one more frame).
(b) Records a toy decoder (L layers x S decode steps, three calls per layer, every layer's
    weights passed again at every step) and compares the bytes on disk with the bytes
    the recorded tensors would take stored inline in every call.
Prints Markdown tables (pasted into docs/PERFORMANCE.md).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import tempfile
import time
import timeit
from pathlib import Path
from typing import Callable

import torch

import replay
from replay.snapshot import Snapshot

HIDDEN = 256


def median_ns_per_call(fn: Callable[[], object], iterations: int, repeats: int) -> float:
    timings = timeit.repeat(fn, number=iterations, repeat=repeats)
    return statistics.median(timings) / iterations * 1e9


def overhead_rows(iterations: int, repeats: int) -> list[tuple[str, float, float, float]]:
    """(workload, plain, recorder wrapper alone, captured variant) in ns/call, no recording active."""
    def noop(x: object, y: object) -> object:
        return x

    def small_add(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.add(x, y)

    a, b = torch.randn(1024), torch.randn(1024)
    rows = []
    for label, fn in (("python no-op (x, y) -> x", noop), ("torch.add, 1024 fp32", small_add)):
        captured = replay.capture(f"bench_{fn.__name__}")(fn)  # a registry Variant around the wrapper
        wrapper = captured.call
        rows.append((label, median_ns_per_call(lambda: fn(a, b), iterations, repeats),
                     median_ns_per_call(lambda: wrapper(a, b), iterations, repeats),
                     median_ns_per_call(lambda: captured(a, b), iterations, repeats)))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200_000, help="calls per timing")
    parser.add_argument("--repeats", type=int, default=7, help="timings per function (the median is reported)")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4, help="decode steps: each passes every weight again")
    args = parser.parse_args()

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"torch {torch.__version__}, cuda available: {torch.cuda.is_available()}\n")
    print("| workload (no recording active) | plain ns/call | recorder wrapper ns/call (ratio) "
          "| captured variant ns/call (ratio) | extra ns/call |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label, plain_ns, wrapper_ns, captured_ns in overhead_rows(args.iterations, args.repeats):
        print(f"| {label} | {plain_ns:.0f} | {wrapper_ns:.0f} ({wrapper_ns / plain_ns:.2f}x) "
              f"| {captured_ns:.0f} ({captured_ns / plain_ns:.2f}x) | {captured_ns - plain_ns:.0f} |")

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


if __name__ == "__main__":
    main()
