"""A flight recording's stores in pieces (replay/recorder/flight_pieces.py): a decode step's ring
holds the pieces the step changed, not a copy of its cache, and a dump writes what a full
recording of the same calls holds. The device logic runs on CPU tensors in Triton's interpreter
here (chunk_changes.DEVICES gains "cpu"), as on a GPU."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import replay
from replay.recorder import chunk_changes, flight_pieces
from replay.snapshot import Snapshot, writer
from test_capture_piece_changes import fetched_pieces

PIECE = writer.CHUNK_BYTES
CACHE_BYTES = 64 * 4096 * 4  # 1 MiB: 16 pieces, a row a quarter of one


@replay.capture("flight_write_row", mutates=("cache",))
def write_row(cache: torch.Tensor, row: torch.Tensor, position: int) -> None:
    cache[position] = row


def decode(cache: torch.Tensor, steps: range, device: str) -> None:
    """Write a row a step (rows nine apart: a piece each step; step 3 writes zeros over step 1's
    row, alone in its piece, which becomes a piece of zeros again), and change a row outside any
    recorded call every third step, so that a call's store before it differs from the last one's after."""
    for step in steps:
        if step % 3 == 2:
            cache[63] += 1
        position, value = (9, 0.0) if step == 3 else (step * 9 % 64, float(step + 1))
        write_row(cache, torch.full((4096,), value, device=device), position)


def calls(path: Path) -> list[tuple[int, dict[str, torch.Tensor]]]:
    return [(record.index, {key: t.cpu() for key, t in record.tensors.items()}) for record in Snapshot(path)]


def assert_same_calls(flight: list, full: list) -> None:
    assert [index for index, _ in flight] == [index for index, _ in full]
    for (index, got), (_, want) in zip(flight, full):
        assert got.keys() == want.keys(), index
        for key in want:
            assert torch.equal(got[key], want[key]), (index, key)


@pytest.mark.parametrize("ring", [1, 3])
def test_a_dump_writes_the_calls_a_full_recording_of_them_holds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                device: str, ring: int) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    with replay.recording(tmp_path / "full", chunk_threshold=1):
        decode(torch.zeros(64, 4096, device=device), range(14), device)
    full = calls(tmp_path / "full")
    cache = torch.zeros(64, 4096, device=device)
    with replay.recording(tmp_path / "flight", chunk_threshold=1, ring=ring):
        decode(cache, range(10), device)
        assert replay.dump() == ring
        first = calls(tmp_path / "flight")
        decode(cache, range(10, 14), device)  # the ring starts again: a store after a dump compares with nothing
        assert replay.dump() == ring
    assert_same_calls(first, full[10 - ring:10])
    assert_same_calls(calls(tmp_path / "flight"), full[10 - ring:10] + full[14 - ring:])


@pytest.mark.parametrize("fill", [0.0, 0.5])
def test_the_ring_holds_one_whole_cache_and_the_pieces_each_step_changed(monkeypatch: pytest.MonkeyPatch,
                                                                         device: str, tmp_path: Path,
                                                                         fill: float) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    brought = fetched_pieces(monkeypatch)
    cache = torch.full((64, 4096), fill, device=device)
    written: set[int] = set()  # the pieces the rows so far fell in
    with replay.recording(tmp_path / "flight", chunk_threshold=1, ring=4) as rec:
        for step in range(12):
            row = step * 9 % 64
            write_row(cache, torch.full((4096,), float(step + 1), device=device), row)
            written.add(row * 4096 * 4 // PIECE)
            assert rec.ring is not None and rec.ring.stores is not None
            # two stores a call (the cache before and after it) in four calls: a cache copy each
            # would be 8 MiB; once the first call (two whole stores: nothing to compare with) is
            # forgotten, held are the base (one cache; of a cache of zeros, the pieces written
            # since) and a piece a call, the rows aside
            if step >= 4 or not fill:
                base = len(written) * PIECE if not fill else CACHE_BYTES
                assert rec.ring.stores.nbytes <= base + 4 * 2 * PIECE
            # the stores of calls before this one settled: no device memory held for them (on a
            # GPU this call's two may wait for their launch, and settle when the next call comes)
            assert rec.pieces.staged_bytes <= (2 * CACHE_BYTES if device != "cpu" else 0)
            if device != "cpu":
                torch.cuda.synchronize()  # the next call finds these landed, however slow the device
        assert replay.dump() == 4
        assert rec.pieces.staged_bytes == 0  # the dump brought over what waited on the device
    # the first call's stores come over whole (its store after compares with what its store before
    # compares with: nothing) but for pieces of zeros, and then a piece a call (the store before
    # each call changed nothing since the one after the last: nothing of it comes over, whether it
    # settles in the ring or, its launch still running on a GPU, the dump names it by the store before)
    assert [pieces for pieces in brought if pieces] == ([1] if not fill else [16, 16]) + [1] * 11
    assert torch.equal(list(Snapshot(tmp_path / "flight"))[-1].tensors["out/cache"], cache.cpu())


def test_a_base_no_held_store_compares_with_goes_when_the_budget_is_short(monkeypatch: pytest.MonkeyPatch,
                                                                          device: str, tmp_path: Path) -> None:
    # a program that stores a new cache every few steps: the old caches' bases are not kept past
    # the budget, and what the ring still holds dumps right
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    with replay.recording(tmp_path / "full", chunk_threshold=1):
        for generation in range(3):
            decode(torch.zeros(64, 4096, device=device), range(3 * generation, 3 * generation + 3), device)
    full = calls(tmp_path / "full")
    caches = []
    # a cache's first call holds two whole stores, the base of the last generation's one more; the
    # one before that (no held store compares with it) must go, not the calls held
    with replay.recording(tmp_path / "flight", chunk_threshold=1, ring=3, ring_bytes=4 * CACHE_BYTES) as rec:
        for generation in range(3):
            caches.append(torch.zeros(64, 4096, device=device))  # kept alive: its memory is not reused
            decode(caches[-1], range(3 * generation, 3 * generation + 3), device)
            assert rec.ring is not None and rec.ring.stores is not None
            assert rec.ring.stores.nbytes <= 4 * CACHE_BYTES
        assert replay.dump() == 3
    assert_same_calls(calls(tmp_path / "flight"), full[-3:])


def test_a_base_over_zeros_makes_only_the_pieces_written_with_bytes() -> None:
    # a base of a cache of zeros is calloc'd: a later store's pieces of zeros are written into it
    # only where the base holds bytes, and a copy of it makes only those pieces
    pieces = 4
    base = chunk_changes.HeldPieces(np.full(pieces * PIECE, 7, dtype=np.uint8),  # 7: pages never made
                                    dict(zip(range(pieces), range(pieces))), resident=set())
    first = chunk_changes.HeldPieces(np.full(PIECE, 1, dtype=np.uint8), {2: 0}, zeros={0, 1, 3})
    first.write_into(base, pieces * PIECE)
    assert base.resident == {2} and base.nbytes == PIECE
    assert (base.host[2 * PIECE:3 * PIECE] == 1).all() and (base.host[:2 * PIECE] == 7).all()
    later = chunk_changes.HeldPieces(np.full(PIECE, 5, dtype=np.uint8), {1: 0}, zeros={2, 3})
    later.write_into(base, pieces * PIECE)  # piece 2 back to zeros: written; piece 3 left unmade
    assert base.resident == {1, 2}
    assert (base.host[PIECE:2 * PIECE] == 5).all() and (base.host[2 * PIECE:3 * PIECE] == 0).all()
    assert (base.host[3 * PIECE:] == 7).all()
    copied = base.copy()
    assert copied.resident == {1, 2} and copied.nbytes == 2 * PIECE
    assert np.array_equal(copied.host[PIECE:3 * PIECE], base.host[PIECE:3 * PIECE])
    assert not copied.host[:PIECE].any() and not copied.host[3 * PIECE:].any()


def resident_mib() -> int:
    """This process's resident memory (Linux)."""
    import os
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads resident memory from /proc (Linux)")
def test_a_base_and_its_copy_make_the_pages_of_their_pieces_alone() -> None:
    # a 256 MiB cache of zeros, a piece written every 2 MiB: 8 MiB of pieces, where pages of 2 MiB
    # (transparent huge pages, which numpy asks for) would make the whole cache resident
    pieces, apart = 4096, (2 << 20) // PIECE
    before = resident_mib()
    written = chunk_changes.HeldPieces(np.full(PIECE, 3, dtype=np.uint8), {}, zeros=set(range(pieces)))
    written.slots = {n: 0 for n in range(0, pieces, apart)}
    written.zeros -= set(written.slots)
    base = flight_pieces._zeros_and(written, pieces * PIECE, pieces)
    assert base.nbytes == len(written.slots) * PIECE == 8 << 20
    assert resident_mib() - before < 24  # 8 MiB of pieces, not 256
    copied = base.copy()
    assert resident_mib() - before < 40  # and as much again for the copy
    assert copied.nbytes == base.nbytes and (copied.host[apart * PIECE:apart * PIECE + PIECE] == 3).all()
    assert not copied.host[PIECE:2 * PIECE].any()
