"""What a recording's writer spends in Python on a tracked store of many pieces of which few
changed (a KV cache of GBs that a decode step writes a row of): its content key looked up, the
digests known from the store before, the plan of what to fetch, every piece's digest (the new
ones hashed), their packs and chunk list (an edit of the list before), and the store remembered,
for a store of `--pieces` 64 KiB pieces with `--changed` of them new, into a snapshot in a
temporary folder. No GPU: the checksums are made up on the host.

    python scripts/bench_writer_pieces.py [--pieces 81920] [--changed 1] [--repeat 5]

Prints the best of --repeat timings of 10 stores, in ms a store. Run it from two trees to compare.
"""
from __future__ import annotations

import argparse
import tempfile
import timeit
from pathlib import Path
from typing import Callable

import numpy as np

from replay.recorder import chunk_changes, piece_batch
from replay.snapshot import SnapshotWriter, writer

DISTINCT = 64  # the first store's pieces repeat this many arrays: its bytes need not be GBs


def stores(pieces: int, changed: int, folder: Path) -> Callable[[], object]:
    """A store written once into a snapshot in `folder`, and what writes a store compared with it
    as a recording's writer does: its known digests, its plan, its pieces put (the new ones hashed
    and packed once, then known) and the store remembered."""
    snapshot = SnapshotWriter(folder / "snapshot")
    lineage = ("op", "cache")
    rows = np.zeros((pieces, piece_batch.ROW), dtype=np.int64)
    rows[:, 0], rows[:, 1] = np.arange(1, pieces + 1), 7
    before = chunk_changes.PieceHistory(None, piece_batch.Place(piece_batch.Checksums.known(rows.copy()), 0, pieces),
                                        False, chunk_changes.KnownContent(), nbytes=pieces * writer.CHUNK_BYTES)
    distinct = [np.full(writer.CHUNK_BYTES, n, dtype=np.uint8) for n in range(DISTINCT)]
    listed, digests = snapshot.put_pieces([distinct[n % DISTINCT] for n in range(pieces)], lineage=lineage)
    before.hashed(list(digests), listed)
    new = np.linspace(0, pieces - 1, changed, dtype=np.int64)
    rows[new, 0], rows[new, 2] = -1 - new, 1
    bytes_of = {int(n): np.full(writer.CHUNK_BYTES, DISTINCT + n % 128, dtype=np.uint8) for n in new}

    def store() -> object:
        after = chunk_changes.PieceHistory(before, piece_batch.Place(piece_batch.Checksums.known(rows), 0, pieces),
                                           True, chunk_changes.KnownContent(), nbytes=pieces * writer.CHUNK_BYTES)
        same = after.stored_before()  # as a writer asks first (no piece changed; or bytes stored before)
        if same is not None:
            after.hashed(*same, new=[])
            return same[1]
        before_known = after.known()
        assert before_known is not None
        resolved, alike, wanted, _ = after.plan(before_known)
        fetched: list[np.ndarray | None] = [None] * pieces
        for n in wanted:
            fetched[n] = bytes_of[n]
        known = chunk_changes.after_plan(before_known, resolved, alike)  # as fetch() gives it
        listed, digests = snapshot.put_pieces(fetched, known, lineage)
        after.hashed(digests, listed, new=known.unknown)
        return listed
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pieces", type=int, default=81920, help="the store's pieces (81920: 5 GiB)")
    parser.add_argument("--changed", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        best = min(timeit.repeat(stores(args.pieces, args.changed, Path(folder)), number=10, repeat=args.repeat)) / 10
    print(f"{args.pieces} pieces, {args.changed} changed: {best * 1e3:.2f} ms a store")


if __name__ == "__main__":
    main()
