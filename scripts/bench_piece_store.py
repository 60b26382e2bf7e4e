"""What one tracked store of a large GPU tensor costs the program's thread, part by part: the
recorder's checksum kernel and its allocations, the copy of its checksums and change flags to the
host, and the whole store (replay/recorder/chunk_changes.py), in microseconds of host time a store,
each measured alone (no writers running, so no contention for the interpreter lock); and a call's
stores checksummed by one launch (replay/recorder/piece_batch.py), a store's share of it.

    python scripts/bench_piece_store.py [--mib 16] [--stores 400]      # needs a GPU
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

import torch

from replay.recorder import chunk_changes, copies, piece_batch, piece_sums
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
    parser.add_argument("--batch", type=int, default=4, help="stores a launch, for the batched rows")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_piece_store.py: needs a GPU (the stores it times are the GPU path)")
    span = torch.randn(args.mib << 19, device="cuda", dtype=torch.bfloat16)
    raw = span.view(torch.uint8)
    pieces = -(-raw.numel() // piece_sums.CHUNK_BYTES)
    sums, staged = piece_sums.piece_sums(raw, None, True)
    row = [0] * piece_sums.COLUMNS
    row[piece_sums.WORDS_AT], row[piece_sums.NWORDS] = raw.data_ptr(), raw.numel() // 4
    row[piece_sums.SUMS] = row[piece_sums.LAST] = sums.data_ptr()  # compared with itself: nothing changed
    row[piece_sums.STAGED] = staged.data_ptr()
    table = torch.tensor([row], dtype=torch.int64, device="cuda")
    tracker = chunk_changes.PieceTracker()

    def store(observe: Callable[[torch.Tensor, piece_batch.PieceBatch], chunk_changes.PieceHistory | None],
              stores: int = 1) -> Callable[[], None]:
        """`stores` stores of the span, each a call's (a blob's, none before it), checksummed by one launch."""
        spans = [span[n:] if n else span for n in range(0, stores * 8, 8)]  # other memory, alike
        def once() -> None:
            batch = copies.piece_batch(span.device, copies.SHARED_POOL)
            histories = [observe(s, batch) for s in spans]
            batch.flush()
            for history in histories:
                assert history is not None
                history.hashed(None)  # as a writer done with it: its staged pieces let go
        return once

    batched = max(1, args.batch)
    rows = [
        ("two allocations (checksums and flags, staged)",
         lambda: (torch.empty(pieces, piece_sums.ROW, dtype=torch.int64, device="cuda"),
                  torch.empty(pieces * piece_sums.WORDS, dtype=torch.int32, device="cuda")), 1),
        ("the Triton launch alone",
         lambda: piece_sums.launch(table.data_ptr(), 1, piece_sums.programs_of(pieces), span.device), 1),
        ("one copy to the host (.to('cpu', non_blocking=True))", lambda: sums.to("cpu", non_blocking=True), 1),
        ("a CUDA event recorded", lambda: torch.cuda.Event().record(torch.cuda.current_stream()), 1),
        ("geometry and storage span", lambda: storage_span(span, geometry_of(span)), 1),
        ("a whole chunked store, its launch alone", store(lambda s, b: tracker.observe(s, True, b)), 1),
        ("a whole blob store, its launch alone", store(tracker.observe_blob), 1),
        (f"a chunked store, one of {batched} a launch", store(lambda s, b: tracker.observe(s, True, b), batched),
         batched),
    ]
    print(f"{torch.cuda.get_device_name()}; a {args.mib} MiB tensor ({pieces} pieces); {args.stores} stores a row\n")
    print("| part of a store | host us |\n| --- | ---: |")
    for label, work, stores in rows:
        print(f"| {label} | {host_us(work, args.stores) / stores:.1f} |")


if __name__ == "__main__":
    main()
