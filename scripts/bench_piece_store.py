"""What one tracked store of a large GPU tensor costs the program's thread, part by part: the
recorder's checksum kernel and its allocations, the copy of its checksums and change flags to the
host, and the whole store (replay/recorder/chunk_changes.py), in microseconds of host time a store,
each measured alone (no writers running, so no contention for the interpreter lock).

    python scripts/bench_piece_store.py [--mib 16] [--stores 400]      # needs a GPU
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

import torch

from replay.recorder import chunk_changes, piece_sums
from replay.snapshot.tensors import geometry_of, storage_span


def host_us(work: Callable[[], object], stores: int) -> float:
    """Host microseconds a call of `work`, after a warm-up, the device drained before and after."""
    for _ in range(20):
        work()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(stores):
        work()
    elapsed = time.perf_counter() - started
    torch.cuda.synchronize()
    return elapsed / stores * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=16, help="the tensor stored, in MiB")
    parser.add_argument("--stores", type=int, default=400, help="stores timed a row")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_piece_store.py: needs a GPU (the stores it times are the GPU path)")
    span = torch.randn(args.mib << 19, device="cuda", dtype=torch.bfloat16)
    raw = span.view(torch.uint8)
    words = raw.view(torch.int32)
    pieces = -(-words.numel() // piece_sums.WORDS)
    sums, staged = piece_sums.piece_sums(raw, None, True)
    weights = piece_sums._weights(raw.device)
    tracker = chunk_changes.PieceTracker()

    def launch_alone() -> None:
        piece_sums._piece_sums_kernel[(-(-pieces // piece_sums._GROUP),)](
            words, words.numel(), pieces, weights, sums, sums, staged, WORDS=piece_sums.WORDS,
            BLOCK=piece_sums._BLOCK, GROUP=piece_sums._GROUP, ROW=piece_sums.ROW, COMPARE=True, STAGE=True,
            num_warps=8)

    def store(observe: Callable[[torch.Tensor], chunk_changes.PieceHistory | None]) -> Callable[[], None]:
        def once() -> None:
            history = observe(span)
            assert history is not None
            history.hashed(None)  # as a writer done with it: its staged pieces let go
        return once

    rows = [
        ("two allocations (checksums and flags, staged)",
         lambda: (torch.empty(pieces, piece_sums.ROW, dtype=torch.int64, device="cuda"),
                  torch.empty(pieces * piece_sums.WORDS, dtype=torch.int32, device="cuda"))),
        ("the Triton launch alone", launch_alone),
        ("piece_sums(): allocations and launch", lambda: piece_sums.piece_sums(raw, sums, True)),
        ("one copy to the host (.to('cpu', non_blocking=True))", lambda: sums.to("cpu", non_blocking=True)),
        ("a CUDA event recorded", lambda: torch.cuda.Event().record(torch.cuda.current_stream())),
        ("geometry and storage span", lambda: storage_span(span, geometry_of(span))),
        ("a whole chunked store (PieceTracker.observe, staged)", store(lambda s: tracker.observe(s, True))),
        ("a whole blob store (PieceTracker.observe_blob)", store(tracker.observe_blob)),
    ]
    print(f"{torch.cuda.get_device_name()}; a {args.mib} MiB tensor ({pieces} pieces); {args.stores} stores a row\n")
    print("| part of a store | host us |\n| --- | ---: |")
    for label, work in rows:
        print(f"| {label} | {host_us(work, args.stores):.1f} |")


if __name__ == "__main__":
    main()
