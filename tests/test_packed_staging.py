"""A store too large to stage whole (a KV cache of many GB) stages its changed pieces packed into a
room (chunk_changes.PACKED_ROOM_BYTES): a decode step then stages what it wrote, not the cache,
and where a call changed more than the room holds, the store comes to the host whole before the
program goes on. The device logic runs on CPU tensors in Triton's interpreter here
(chunk_changes.DEVICES gains "cpu"), as on a GPU; the snapshot must be the one recorded without it."""
from __future__ import annotations

import contextlib
import gc
import weakref
from pathlib import Path
from typing import Callable

import pytest
import torch

import replay
from replay.recorder import chunk_changes, copies, cuda_runtime, piece_batch, piece_sums
from replay.snapshot import writer
from test_capture_piece_changes import contents, fetched_pieces, hashed_pieces, record_decode
from test_flight_pieces import assert_same_calls, calls, decode

PIECE = writer.CHUNK_BYTES
WORDS = PIECE // 4


@replay.capture("packed_write_rows", mutates=("cache",))
def write_rows(cache: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor) -> None:
    cache[positions] = rows


def test_a_packed_store_gives_each_changed_piece_but_zeros_a_slot_and_copies_those_within_its_room(
        device: str) -> None:
    gen = torch.Generator().manual_seed(3)
    raw = torch.randint(1, 256, (8 * PIECE,), generator=gen, dtype=torch.uint8).to(device)
    before, _ = piece_sums.piece_sums(raw, None, stage=False)
    changed = raw.clone()
    changed[1 * PIECE + 5] ^= 1
    changed[4 * PIECE + 9] ^= 1
    changed[6 * PIECE:7 * PIECE] = 0  # a piece of zeros: known by its checksums, never staged
    for room in (4, 2, 1):
        sums, staged = piece_sums.piece_sums(changed, before, stage=True, room=room)
        assert sums[:, 2].nonzero().flatten().tolist() == [1, 4, 6]
        slots = sums[:, piece_batch.SLOT].tolist()
        assert sorted(slots[n] for n in (1, 4)) == [0, 1] and slots[6] == -1
        assert [slots[n] for n in (0, 2, 3, 5, 7)] == [-1] * 5
        assert staged is not None and staged.numel() == room * WORDS
        for n in (1, 4):
            if slots[n] < room:  # within the room: copied to its slot; past it, counted only
                assert torch.equal(staged.view(torch.uint8)[slots[n] * PIECE:(slots[n] + 1) * PIECE],
                                   changed[n * PIECE:(n + 1) * PIECE])


def past_the_budget(monkeypatch: pytest.MonkeyPatch) -> tuple[list[int], list[int]]:
    """A staging budget of 8 pieces, which a 16-piece cache never fits whole, and packed rooms of
    2; the packed rooms the stores that could not stage whole were given (0: none, copied whole),
    and the pieces of each packed store whose changes overflowed its room."""
    monkeypatch.setattr(chunk_changes, "DEVICE_STAGING_BYTES", 8 * PIECE)
    monkeypatch.setattr(chunk_changes, "PACKED_ROOM_BYTES", 2 * PIECE)
    rooms: list[int] = []
    overflows: list[int] = []
    packed_room, take_whole = chunk_changes.PieceTracker._packed_room, chunk_changes.PieceHistory.take_whole

    def room_given(self, padded, whole_only):
        rooms.append(packed_room(self, padded, whole_only))
        return rooms[-1]

    def taken_whole(self, run, take, give):
        overflows.append(self.place.pieces)
        return take_whole(self, run, take, give)
    monkeypatch.setattr(chunk_changes.PieceTracker, "_packed_room", room_given)
    monkeypatch.setattr(chunk_changes.PieceHistory, "take_whole", taken_whole)
    return rooms, overflows


def untracked(record: Callable[[Path, str], object], path: Path, monkeypatch: pytest.MonkeyPatch,
              device: str) -> None:
    """`record` into `path` with no piece tracked (the snapshot to match), then tracking on."""
    monkeypatch.setattr(chunk_changes, "DEVICES", ())
    record(path, device)
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))


def test_past_the_staging_budget_a_store_stages_only_its_changed_pieces(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        device: str) -> None:
    untracked(record_decode, tmp_path / "untracked", monkeypatch, device)
    rooms, overflows = past_the_budget(monkeypatch)
    counts, fetched = hashed_pieces(monkeypatch), fetched_pieces(monkeypatch)
    record_decode(tmp_path / "tracked", device)  # every staged byte given back after: asserted there
    assert contents(tmp_path / "tracked") == contents(tmp_path / "untracked")
    # six calls store the cache before and after, each packed into two pieces: the first store's
    # pieces are zeros (none staged), a row changes one piece, which fits
    assert rooms == [2] * 12 and overflows == []
    assert counts == [0] + [1] * 6  # the first store's zeros named by their checksums; then the row's piece
    assert fetched == [0] + [1] * 6  # the zeros: nothing; then each call's store after it, its one changed piece


def test_a_packed_store_dropped_before_its_launch_lets_go_of_the_programs_tensor(
        monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    # its launch would copy the tensor whole on overflow: until then the store holds it, and the
    # tracker holds the store while the memory is its last stored (a cache of GBs, in a program)
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    past_the_budget(monkeypatch)
    tracker = chunk_changes.PieceTracker()
    cache = torch.zeros(64, 4096, device=device)
    batch = copies.piece_batch(torch.device(device), copies.SHARED_POOL)
    tracker.observe(cache, True, batch)
    batch.flush()
    batch = copies.piece_batch(torch.device(device), copies.SHARED_POOL)
    stored = tracker.observe(cache, True, batch)
    assert stored is not None and stored.place.room == 2
    held = weakref.ref(cache)
    del batch, cache  # the call dropped mid-way, its batch never launched
    gc.collect()
    assert held() is None


def record_rows(path: Path, device: str, ring: int | None = None) -> torch.Tensor:
    """Rows written one piece a step, then three pieces at once (past a room of two), then one."""
    cache = torch.zeros(64, 4096, device=device)  # 1 MiB: 16 pieces, a row a quarter of one
    with replay.recording(path, chunk_threshold=1, ring=ring):
        for step, positions in enumerate(([0], [16], [4, 20, 40], [60])):
            at = torch.tensor(positions, device=device)
            write_rows(cache, torch.full((len(positions), 4096), float(step + 1), device=device), at)
            cache[1] += 1.0  # the program goes on writing the cache: the store after the call was taken before
        if ring:
            replay.dump()
    return cache


def test_a_packed_store_whose_changes_pass_its_room_comes_over_whole_before_the_program_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    untracked(record_rows, tmp_path / "untracked", monkeypatch, device)
    rooms, overflows = past_the_budget(monkeypatch)
    record_rows(tmp_path / "tracked", device)
    assert contents(tmp_path / "tracked") == contents(tmp_path / "untracked")
    # the store before each call differs from the last one after it by the program's row 1 (a piece);
    # the third call's store after it changed three pieces, past its room of two: taken whole
    assert rooms == [2] * 8 and overflows == [16]


def test_a_flight_recording_past_the_staging_budget_dumps_what_a_full_recording_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    with replay.recording(tmp_path / "full", chunk_threshold=1):
        decode(torch.zeros(64, 4096, device=device), range(10), device)
    record_rows(tmp_path / "rows_full", device)
    rooms, overflows = past_the_budget(monkeypatch)
    with replay.recording(tmp_path / "flight", chunk_threshold=1, ring=3):
        decode(torch.zeros(64, 4096, device=device), range(10), device)
        assert replay.dump() == 3
    assert_same_calls(calls(tmp_path / "flight"), calls(tmp_path / "full")[-3:])
    assert rooms and all(rooms)  # every store packed
    record_rows(tmp_path / "rows_flight", device, ring=4)
    assert_same_calls(calls(tmp_path / "rows_flight"), calls(tmp_path / "rows_full"))
    assert overflows == [16]


def test_a_flight_recording_whose_store_finds_no_room_at_all_holds_its_host_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    # copies through the runtime (its host twin here), whose host tensor is made from the pooled buffer
    # when first read: on an H100 the ring read it after taking the buffer away (2026-12-07)
    monkeypatch.setattr(cuda_runtime, "HOST_TWINS", ("cpu",))
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    with replay.recording(tmp_path / "full", chunk_threshold=1):
        decode(torch.zeros(64, 4096, device=device), range(6), device)
    monkeypatch.setattr(chunk_changes, "DEVICE_STAGING_BYTES", 0)  # no room, packed or whole
    given = pool_gives(monkeypatch)
    with replay.recording(tmp_path / "flight", chunk_threshold=1, ring=2):
        decode(torch.zeros(64, 4096, device=device), range(6), device)
        assert replay.dump() == 2
    assert_same_calls(calls(tmp_path / "flight"), calls(tmp_path / "full")[-2:])
    # each store's host copy went back to the pool once, its own: a buffer given twice is handed
    # out twice, and a later recording's copies overwrite each other
    assert given and len(given) == len(set(given))


def pool_gives(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The addresses of the pinned buffers given back to the recordings' pool, in order, each
    between two takes of it."""
    given: list[int] = []
    take, give = copies.PinnedPool.take, copies.PinnedPool.give

    def taking(self: copies.PinnedPool, nbytes: int) -> torch.Tensor:
        buffer = take(self, nbytes)
        with contextlib.suppress(ValueError):
            given.remove(buffer.data_ptr())  # out again: it may come back once more
        return buffer

    def giving(self: copies.PinnedPool, buffer: torch.Tensor) -> None:
        given.append(buffer.data_ptr())
        give(self, buffer)
    monkeypatch.setattr(copies.PinnedPool, "take", taking)
    monkeypatch.setattr(copies.PinnedPool, "give", giving)
    return given
