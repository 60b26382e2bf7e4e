"""What one operation costs the thread that makes it while another Python thread wants the
interpreter lock: each operation alone, then beside a thread that runs Python without pause
(the worst a recording's writer threads can be), under the switch interval a recording sets.

    python scripts/lock_tax.py                 # on a GPU: torch's operators and the CUDA runtime's own calls
    python scripts/lock_tax.py --calls 500     # fewer calls an operation

A torch operator lets go of the lock while it works and must then take it back: beside a thread
that wants it, that costs up to a switch interval. A call that keeps the lock (an attribute
read; the CUDA runtime called through ctypes.PyDLL, for work that only queues on a stream and
returns) costs the same either way. The rows: torch operators a recorded call makes (a copy to
pinned memory, an allocation, views, an event), the same device work through the CUDA runtime
with the lock kept (and, for comparison, let go: ctypes.CDLL), and reading a tensor's address
and strides. Prints a Markdown table of microseconds an operation. A diagnosis of the mechanism
behind a recording's cost (docs/PERFORMANCE.md), not a benchmark of kernel-replay.
"""
from __future__ import annotations

import argparse
import ctypes
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import torch

SWITCH_INTERVAL_S = 0.0003  # what replay/recorder/lifecycle.py sets while writer threads run


def per_call_us(operation: Callable[[], object], calls: int, beside_python: bool) -> float:
    """Microseconds an operation, alone or beside a thread running Python all the while."""
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass
    spinner = threading.Thread(target=spin, daemon=True)
    if beside_python:
        spinner.start()
        time.sleep(0.02)
    synchronize = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    synchronize()
    started = time.perf_counter()
    for _ in range(calls):
        operation()
    elapsed = time.perf_counter() - started
    stop.set()
    if beside_python:
        spinner.join()
    synchronize()
    return elapsed / calls * 1e6


def cuda_runtime() -> tuple[ctypes.CDLL, ctypes.CDLL]:
    """The CUDA runtime torch loaded, called keeping the lock (PyDLL) and letting it go (CDLL)."""
    path = next(line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines() if "libcudart" in line)
    libraries = ctypes.PyDLL(path), ctypes.CDLL(path)
    for library in libraries:
        library.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                            ctypes.c_void_p]
        library.cudaMemcpyAsync.restype = ctypes.c_int
        library.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        library.cudaEventRecord.restype = ctypes.c_int
    return libraries


def operations() -> list[tuple[str, Callable[[], object]]]:
    """(what, the operation) on this machine's device: a GPU's, or the host's."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    source = torch.randn(1 << 16, device=device)  # 256 KiB
    nbytes = source.numel() * source.element_size()
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device == "cuda")
    rows: list[tuple[str, Callable[[], object]]] = [
        ("torch: copy 256 KiB into host memory", lambda: host.copy_(source.view(torch.uint8), non_blocking=True)),
        ("torch: allocate 256 KiB", lambda: torch.empty(nbytes, dtype=torch.uint8, device=device)),
        ("torch: as_strided view", lambda: torch.as_strided(source, (1024,), (1,), 0)),
        ("torch: view as bytes", lambda: source.view(torch.uint8)),
        ("address, strides and offset read", lambda: (source.data_ptr(), source.stride(), source.storage_offset())),
    ]
    if device == "cuda":
        keep, drop = cuda_runtime()
        stream = torch.cuda.current_stream().cuda_stream
        event = torch.cuda.Event()
        event.record()
        device_to_host = 2  # cudaMemcpyDeviceToHost
        rows += [
            ("torch: record an event", lambda: event.record()),
            ("CUDA runtime, lock kept: copy 256 KiB to pinned memory",
             lambda: keep.cudaMemcpyAsync(host.data_ptr(), source.data_ptr(), nbytes, device_to_host, stream)),
            ("CUDA runtime, lock let go: the same copy",
             lambda: drop.cudaMemcpyAsync(host.data_ptr(), source.data_ptr(), nbytes, device_to_host, stream)),
            ("CUDA runtime, lock kept: record an event", lambda: keep.cudaEventRecord(event.cuda_event, stream)),
        ]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=3000, help="calls of each operation a measurement")
    args = parser.parse_args()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(f"device: {device}; torch {torch.__version__}; switch interval {SWITCH_INTERVAL_S * 1e3:g} ms\n")
    print("| operation | us alone | us beside a thread running Python |")
    print("| --- | ---: | ---: |")
    for what, operation in operations():
        operation()  # made once before timing (a first allocation, a first copy)
        alone = per_call_us(operation, args.calls, beside_python=False)
        beside = per_call_us(operation, args.calls, beside_python=True)
        print(f"| {what} | {alone:.2f} | {beside:.2f} |")


if __name__ == "__main__":
    main()
