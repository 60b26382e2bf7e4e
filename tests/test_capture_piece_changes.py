"""Which pieces of a chunked tensor changed since its last store is decided where the tensor
lives (replay/recorder/chunk_changes.py, one Triton kernel: piece_sums.py), and only those come
to the host and are hashed there. On a GPU that is the default; on a machine without one the same
logic runs on CPU tensors in Triton's interpreter (chunk_changes.DEVICES gains "cpu"), and the
snapshot must be the very one recorded without it."""
from __future__ import annotations

import gc
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import replay
from replay.recorder import chunk_changes, copies, cuda_runtime, piece_batch, piece_sums
from replay.recorder.device_buffers import DeviceBuffers
from replay.snapshot import Snapshot, hashing, writer

PIECE = writer.CHUNK_BYTES


@replay.capture("piece_write_row", mutates=("cache",))
def write_row(cache: torch.Tensor, row: torch.Tensor, position: int) -> None:
    cache[position] = row


def test_checksums_flag_exactly_the_pieces_that_differ_and_stage_them(device: str) -> None:
    gen = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (5 * PIECE + 4096,), generator=gen, dtype=torch.uint8).to(device)  # a partial last piece
    before, staged = piece_sums.piece_sums(raw, None, stage=True)
    assert before.shape == (6, piece_batch.ROW) and before[:, 2].tolist() == [1] * 6  # nothing to compare with: all new
    assert before[:, piece_batch.SLOT].tolist() == [-1] * 6  # staged where they lie: no slots
    assert torch.equal(staged.view(torch.uint8)[:raw.numel()], raw)
    assert torch.equal(before, piece_sums.piece_sums(raw.clone(), None, stage=False)[0])
    for at in (0, 3 * PIECE + 17, raw.numel() - 1):
        changed = raw.clone()
        changed[at] ^= 1
        sums, staged = piece_sums.piece_sums(changed, before, stage=True)
        assert sums[:, 2].nonzero().flatten().tolist() == [at // PIECE]
        piece = slice(at // PIECE * PIECE, min((at // PIECE + 1) * PIECE, raw.numel()))
        assert torch.equal(staged.view(torch.uint8)[piece], changed[piece])  # the changed piece, staged
        assert not torch.equal(sums, before)


def test_bytes_not_read_as_aligned_words_are_not_tracked(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    tracker = chunk_changes.PieceTracker()
    batch = copies.piece_batch(torch.device(device), copies.SHARED_POOL)
    assert tracker.observe(torch.zeros(PIECE + 4, dtype=torch.uint8, device=device), True, batch) is None  # length
    assert tracker.observe(torch.zeros(PIECE + 32, dtype=torch.uint8, device=device)[4:-12], True, batch) is None
    assert tracker.observe(torch.zeros(PIECE + 16, dtype=torch.uint8, device=device), True, batch) is not None


def test_one_launch_checksums_every_store_of_a_batch_as_each_alone(monkeypatch: pytest.MonkeyPatch,
                                                                     device: str) -> None:
    # a call's stores share a launch: each gets the checksums and flags it would get alone, and a
    # store of memory stored earlier in the same batch compares with that earlier store
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    gen = torch.Generator().manual_seed(1)
    spans = [torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8).to(device)
             for n in (3 * PIECE, 16, 9 * PIECE + 4096)]
    tracker = chunk_changes.PieceTracker()
    batch = copies.piece_batch(torch.device(device), copies.SHARED_POOL)
    histories = [tracker.observe(span, True, batch) for span in spans]
    twice = tracker.observe(spans[0], True, batch)  # its last store is in the batch: that one is launched first
    batch.flush()  # as before a call runs
    for span, history in zip(spans, histories):
        assert history is not None and history.changed is None  # nothing before: every piece new, staged
        alone, _ = piece_sums.piece_sums(span, None, stage=False)
        assert np.array_equal(history.sums, alone[:, :2].cpu().numpy())
        assert torch.equal(history.staged.view(torch.uint8)[:span.numel()], span)
    assert twice is not None and twice.changed.tolist() == [0] * 3 and twice.previous is histories[0]
    spans[2][5 * PIECE + 7] ^= 1  # as the call does
    again = tracker.observe(spans[2], True, batch)
    batch.flush()  # as before the call goes to the writers
    assert again is not None and again.changed.tolist() == [0] * 5 + [1] + [0] * 4
    piece = slice(5 * PIECE, 6 * PIECE)
    assert torch.equal(again.staged.view(torch.uint8)[piece], spans[2][piece])  # the changed piece, staged
    assert again.previous is histories[2]


def test_a_store_made_for_the_call_and_freed_before_the_launch_is_summed_as_it_was(monkeypatch: pytest.MonkeyPatch,
                                                                                    device: str) -> None:
    # an output buffer's mask lives only until its store is added: its memory must not be another's
    # by the time the call's launch reads it
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    gen = torch.Generator().manual_seed(2)
    mask = torch.randint(0, 256, (4 * PIECE,), generator=gen, dtype=torch.uint8).to(device)
    expected = piece_sums.piece_sums(mask.clone(), None, stage=False)[0][:, :2].cpu().numpy()
    tracker = chunk_changes.PieceTracker()
    batch = copies.piece_batch(torch.device(device), copies.SHARED_POOL)
    history = tracker.observe(mask, False, batch)
    del mask
    gc.collect()
    others = [torch.full((4 * PIECE,), 7, dtype=torch.uint8, device=device) for _ in range(8)]
    batch.flush()
    assert history is not None and np.array_equal(history.sums, expected) and others


def test_a_store_whose_last_is_another_calls_not_yet_launched_compares_with_nothing(
        monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    # two threads' calls on one memory: the first's stores wait for its launch, the second's may not
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    span = torch.zeros(2 * PIECE, dtype=torch.uint8, device=device)
    tracker = chunk_changes.PieceTracker()
    first, second = (copies.piece_batch(torch.device(device), copies.SHARED_POOL) for _ in range(2))
    tracker.observe(span, True, first)
    history = tracker.observe(span, True, second)
    second.flush()
    first.flush()
    assert history is not None and history.changed is None and history.sums.shape == (2, 2)


Tracked = tuple[torch.Tensor, chunk_changes.PieceTracker, piece_batch.PieceBatch, chunk_changes.PieceHistory]


def stored_once(monkeypatch: pytest.MonkeyPatch, device: str, pieces: int, seed: int) -> Tracked:
    """Random bytes of `pieces` pieces on a tracked device, stored once (its checksums launched):
    the bytes, the tracker, the batch and that store."""
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    gen = torch.Generator().manual_seed(seed)
    span = torch.randint(0, 256, (pieces * PIECE,), generator=gen, dtype=torch.uint8).to(device)
    tracker = chunk_changes.PieceTracker()
    batch = copies.piece_batch(torch.device(device), copies.SHARED_POOL)
    earlier = tracker.observe(span, True, batch)
    batch.flush()
    assert earlier is not None
    return span, tracker, batch, earlier


def test_a_store_before_its_call_is_copied_aside_and_summed_in_the_launch_after_it(monkeypatch: pytest.MonkeyPatch,
                                                                                   device: str) -> None:
    # the copy aside holds the bytes as they were; the call's own store of the same memory after it
    # shares the launch, comparing with what the copy compares with
    span, tracker, batch, earlier = stored_once(monkeypatch, device, 4, seed=3)
    as_it_was = span.clone()
    span[PIECE + 5] ^= 1  # written between calls
    before = tracker.observe(span, True, batch, clone=True)
    batch.flush_live()  # as the call begins: no row reads the program's memory, nothing is launched
    assert before is not None and before.cloned and before.place.checksums.on_device is None
    span[3 * PIECE] ^= 1  # the call
    after = tracker.observe(span, True, batch)
    batch.flush()
    assert before.previous is earlier and after is not None and after.previous is earlier
    assert before.changed.tolist() == [0, 1, 0, 0] and after.changed.tolist() == [0, 1, 0, 1]
    assert torch.equal(before.staged.view(torch.uint8)[:span.numel()], as_it_was ^ (torch.arange(span.numel(),
                       device=device) == PIECE + 5).to(torch.uint8))
    alone, _ = piece_sums.piece_sums(span, None, stage=False)
    assert np.array_equal(after.sums, alone[:, :2].cpu().numpy())


def count_launches(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The stores each checksum launch sums."""
    launches: list[int] = []
    real = piece_sums.launch

    def counting(table, stores, programs, device):
        launches.append(stores)
        return real(table, stores, programs, device)
    monkeypatch.setattr(piece_sums, "launch", counting)
    return launches


@pytest.mark.parametrize("aside", ["copied", "no room", "too large"])
def test_a_call_is_one_checksum_launch_unless_its_inputs_are_not_copied_aside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str, aside: str) -> None:
    # an input with no room on the device to copy it aside, or past CLONE_BYTES, is summed in a
    # launch before the call, which would change it; either way the recording is the one made
    # without tracking
    monkeypatch.setattr(chunk_changes, "DEVICES", ())
    record_decode(tmp_path / "untracked", device, steps=3)
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    if aside == "no room":
        monkeypatch.setattr(chunk_changes, "DEVICE_STAGING_BYTES", 0)
    if aside == "too large":
        monkeypatch.setattr(chunk_changes, "CLONE_BYTES", 16 * PIECE - 1)  # the cache is 16 pieces
    launches = count_launches(monkeypatch)
    record_decode(tmp_path / "tracked", device, steps=3)
    assert contents(tmp_path / "tracked") == contents(tmp_path / "untracked")
    assert launches == ([2] * 3 if aside == "copied" else [1, 1] * 3)  # in/cache and out/cache

def record_decode(path: Path, device: str, steps: int = 6) -> torch.Tensor:
    cache = torch.zeros(64, 4096, device=device)  # 1 MiB: 16 pieces, a row a quarter of one
    with replay.recording(path, chunk_threshold=1) as rec:
        for step in range(steps):
            write_row(cache, torch.full((4096,), float(step + 1), device=device), step * 9)
    assert rec.pieces.staged_bytes == 0  # every staged store was fetched, or let go
    return cache


def reused_lists(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The chunk lists of stores taken whole from an earlier store: the one before, if nothing
    changed since, or any the recording made of the same bytes."""
    reused: list[str] = []
    real = chunk_changes.PieceHistory.stored_before

    def counting(self):
        same = real(self)
        if same is not None:
            reused.append(same[1])
        return same
    monkeypatch.setattr(chunk_changes.PieceHistory, "stored_before", counting)
    return reused


def fetched_pieces(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many pieces each store (or blob) brought over from where they were staged."""
    counts: list[int] = []
    real = chunk_changes.PieceHistory._bring_over

    def counting(self, wanted, take):
        counts.append(len(wanted))
        return real(self, wanted, take)
    monkeypatch.setattr(chunk_changes.PieceHistory, "_bring_over", counting)
    return counts


def hashed_pieces(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many pieces each store hashed."""
    counts: list[int] = []
    real = hashing.hash_pieces_here

    def counting(pieces):
        counts.append(len(pieces))
        return real(pieces)
    monkeypatch.setattr(hashing, "hash_pieces_here", counting)
    return counts


def contents(path: Path) -> list[tuple[str, list[float]]]:
    return [(key, t.cpu().flatten().tolist()) for record in Snapshot(path) for key, t in record.tensors.items()]


def check_only_changed_pieces_are_hashed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", ())
    record_decode(tmp_path / "untracked", device)
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    counts, fetched = hashed_pieces(monkeypatch), fetched_pieces(monkeypatch)
    reused = reused_lists(monkeypatch)
    cache = record_decode(tmp_path / "tracked", device)
    assert contents(tmp_path / "tracked") == contents(tmp_path / "untracked")
    # each call stores the cache before its row (as the last call left it: the list of the store
    # before, taken whole) and after (the one piece the row lands in); the first store's 16 pieces
    # are zeros: their checksums say so, and none comes over or is hashed. Only the rows come over.
    assert counts == [0] + [1] * 6 and len(reused) == 5
    assert fetched == [0] + [1] * 6
    last = list(Snapshot(tmp_path / "tracked"))[-1]
    assert torch.equal(last.tensors["out/cache"], cache.cpu())


def test_only_the_pieces_a_call_changed_are_hashed_and_come_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    device: str) -> None:
    check_only_changed_pieces_are_hashed(tmp_path, monkeypatch, device)


def test_a_flight_recording_that_forgets_stores_still_writes_what_it_holds(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            device: str) -> None:
    # the stores the ring forgot are never hashed: the ones it holds must not wait for them
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    cache = torch.zeros(64, 4096, device=device)
    with replay.recording(tmp_path / "snap", chunk_threshold=1, ring=3):
        for step in range(10):
            write_row(cache, torch.full((4096,), float(step + 1), device=device), step)
        replay.dump()
    records = list(Snapshot(tmp_path / "snap"))
    assert [r.arguments()["position"] for r in records] == [7, 8, 9]
    assert torch.equal(records[-1].tensors["out/cache"], cache.cpu())


def test_pieces_any_store_hashed_are_known_by_their_checksums(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              device: str) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    counts, fetched = hashed_pieces(monkeypatch), fetched_pieces(monkeypatch)
    # second is longer than first: no store of it is a whole earlier store, its pieces are known one by one
    first, second = torch.zeros(64, 4096, device=device), torch.zeros(80, 4096, device=device)
    first[:16] = 7.0  # a whole piece of sevens
    with replay.recording(tmp_path / "snap", chunk_threshold=1) as rec:
        write_row(first, torch.full((4096,), 7.0, device=device), 16)  # the next piece starts with a row of sevens
        rec.flush()  # known once hashed: a store made while the first is written may hash a piece again
        second[:16] = 7.0
        write_row(second, torch.full((4096,), 7.0, device=device), 0)  # nothing new: all its pieces were stored before
    # first: its sevens (its zeros named by their checksums: neither come over nor hashed); after:
    # the piece the row went to. second: everything known; its after unchanged, its list taken whole
    assert counts == [1, 1, 0] and fetched == [1, 1, 0]
    stored = list(Snapshot(tmp_path / "snap"))[1].tensors
    assert torch.equal(stored["in/cache"], second.cpu()) and torch.equal(stored["out/cache"], second.cpu())


def test_past_the_device_staging_budget_a_store_comes_over_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   device: str) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", ())
    record_decode(tmp_path / "untracked", device)
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    monkeypatch.setattr(chunk_changes, "DEVICE_STAGING_BYTES", 16 * PIECE)  # room for one store at a time
    counts, fetched = hashed_pieces(monkeypatch), fetched_pieces(monkeypatch)
    record_decode(tmp_path / "tracked", device)
    assert contents(tmp_path / "tracked") == contents(tmp_path / "untracked")
    assert counts == [0] + [1] * 6  # flagged either way: hashed the same (the zeros by their length)
    assert 0 < len(fetched) < len(counts)  # some stores found the budget spent and came over whole


def test_a_staged_store_whose_earlier_store_failed_is_refused_not_filled_with_garbage() -> None:
    span = torch.zeros(2 * PIECE, dtype=torch.uint8)
    released: list[int] = []
    rows = piece_batch.Checksums.known(np.array([[1, 2, 1], [3, 4, 1]]))
    first = chunk_changes.PieceHistory(None, piece_batch.Place(rows, 0, 2), False, chunk_changes.KnownContent())
    first.hashed(None)  # its writer failed
    rows = piece_batch.Checksums.known(np.array([[1, 2, 0], [3, 4, 1]]))
    history = chunk_changes.PieceHistory(first, piece_batch.Place(rows, 0, 2), True, chunk_changes.KnownContent(),
                                         torch.zeros(2 * PIECE, dtype=torch.uint8), span.numel(),
                                         _let_go=released.append)
    with pytest.raises(OSError, match="never written"):
        history.fetch(history.known(), lambda n: torch.empty(n, dtype=torch.uint8))
    assert released == [2 * PIECE] and history.staged is None  # its device memory goes back all the same


def test_a_store_says_where_its_digests_are_unknown_as_the_list_itself_does() -> None:
    # of six pieces, one unchanged, one now zeros, one known by its checksums, two alike and new: the
    # places to hash travel with the list (a writer looks for them in no list as long as the tensor)
    first_rows = np.array([[n + 1, n + 1, 0] for n in range(6)])
    first = chunk_changes.PieceHistory(None, piece_batch.Place(piece_batch.Checksums.known(first_rows), 0, 6), False,
                                       chunk_changes.KnownContent(), nbytes=6 * PIECE)
    before = [f"{n:064x}" for n in range(6)]
    first.hashed(list(before))
    recorded = chunk_changes.KnownContent()
    recorded.remember_pieces([((7, 7, PIECE), "known by its checksums")])
    rows = np.array([[1, 1, 0], [0, 0, 1], [9, 9, 1], [7, 7, 1], [9, 9, 1], [6, 6, 0]])
    staged = torch.zeros(6 * PIECE, dtype=torch.uint8)
    staged[2 * PIECE:3 * PIECE] = 5
    history = chunk_changes.PieceHistory(first, piece_batch.Place(piece_batch.Checksums.known(rows), 0, 6), True,
                                         recorded, staged, 6 * PIECE)
    known = history.known()
    assert known is not None and known.unknown == [1, 2, 3, 4] == hashing.nones(known.digests)
    found, resolved, _ = history.fetch(known, lambda n: torch.empty(n, dtype=torch.uint8))
    assert resolved.digests == [before[0], hashing.zero_digest(PIECE), None, "known by its checksums", None, before[5]]
    assert resolved.unknown == [2, 4] == hashing.nones(resolved.digests)
    assert known.fresh == resolved.fresh == [1, 2, 3, 4]  # the zeros' piece may be in no pack yet: looked at
    assert found[2] is found[4] and bool((found[2] == 5).all())
    assert hashing.piece_digests(found, resolved) == hashing.piece_digests(found, resolved.digests)


def test_a_store_puts_only_its_fresh_pieces_into_packs_and_names_every_piece(tmp_path: Path) -> None:
    snapshot = writer.SnapshotWriter(tmp_path / "snapshot")
    pieces = [np.full(PIECE, n, dtype=np.uint8) for n in range(4)]
    listed, digests = snapshot.put_pieces(pieces, lineage=("op", "x"))
    changed = [pieces[0], np.full(PIECE, 9, dtype=np.uint8), np.zeros(PIECE, dtype=np.uint8), pieces[3]]
    known = hashing.Known([digests[0], None, hashing.zero_digest(PIECE), digests[3]], [1], [1, 2])
    _, after = snapshot.put_pieces(changed, known, ("op", "x"))
    assert after == hashing.piece_digests(changed)  # the zeros' piece packed too: it was in no pack
    # a store whose fresh places leave out a piece no pack holds fails, never naming bytes nowhere stored
    unwritten = np.full(PIECE, 77, dtype=np.uint8)  # bytes no store wrote
    unstored = hashing.Known([digests[0], hashing.piece_digests([unwritten])[0], digests[2], digests[3]], [], [])
    with pytest.raises(OSError, match="never written"):
        snapshot.put_pieces([pieces[0], unwritten, pieces[2], pieces[3]], unstored, ("op", "x"))


def test_a_store_copied_to_the_host_whole_skips_the_pieces_it_knows_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                         device: str) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", ())
    record_decode(tmp_path / "untracked", device)
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    monkeypatch.setattr(chunk_changes, "DEVICE_STAGING_BYTES", 0)  # every store comes over whole
    counts, fetched = hashed_pieces(monkeypatch), fetched_pieces(monkeypatch)
    record_decode(tmp_path / "tracked", device)
    assert contents(tmp_path / "tracked") == contents(tmp_path / "untracked")
    # the first store's 16 pieces are zeros, named by their length (none hashed); each later store
    # hashes the one piece its call wrote
    assert counts == [0] + [1] * 6 and fetched == []


def test_where_the_device_has_no_room_to_stage_a_store_comes_over_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        device: str) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", ())
    record_decode(tmp_path / "untracked", device)
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))

    def no_room(nbytes, device):  # not for a piece: the checksums' few bytes still fit
        if nbytes >= PIECE:
            raise torch.OutOfMemoryError("CUDA out of memory (as the test says)")
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    monkeypatch.setattr(chunk_changes, "staging_buffer", no_room)
    fetched = fetched_pieces(monkeypatch)
    record_decode(tmp_path / "tracked", device)  # its staged bytes are back to 0 after: asserted there
    assert contents(tmp_path / "tracked") == contents(tmp_path / "untracked") and fetched == []


def test_the_pieces_known_by_checksums_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   device: str) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    monkeypatch.setattr(chunk_changes, "SEEN_PIECES", 2)
    with replay.recording(tmp_path / "snap", chunk_threshold=1) as rec:
        for step in range(4):
            write_row(torch.full((64, 4096), float(step), device=device), torch.zeros(4096, device=device), 0)
            rec.flush()
            assert rec.pieces.known_pieces <= 2 + 2  # at most the bound, and the two a store adds past it
    assert len(list(Snapshot(tmp_path / "snap"))) == 4


@replay.capture("piece_write_row_or_fail", mutates=("cache",))
def write_row_or_fail(cache: torch.Tensor, row: torch.Tensor, position: int) -> None:
    if position < 0:
        raise IndexError("no such position")
    cache[position] = row


def test_a_call_that_failed_after_its_store_leaves_the_next_store_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        device: str, said) -> None:
    # the failed call's store was never written: the next store of that memory compares with nothing
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    cache = torch.zeros(64, 4096, device=device)
    with replay.recording(tmp_path / "snap", chunk_threshold=1):
        write_row_or_fail(cache, torch.ones(4096, device=device), 0)
        with pytest.raises(IndexError):
            write_row_or_fail(cache, torch.ones(4096, device=device), -1)
        write_row_or_fail(cache, torch.full((4096,), 2.0, device=device), 5)
    first, last = Snapshot(tmp_path / "snap")
    assert torch.equal(last.tensors["out/cache"], cache.cpu()) and said() == []


def test_changed_pieces_come_over_a_run_at_a_time() -> None:
    assert chunk_changes.consecutive_runs([0, 1, 2, 5, 7, 8]) == [(0, 3), (5, 6), (7, 9)]
    assert chunk_changes.consecutive_runs([4]) == [(4, 5)]


def record_steps(path: Path, device: str, steps: int = 3) -> None:
    """A training step's activation, the same bytes each step in memory that held others between:
    a cache filled alike each step, then a row written into it."""
    with replay.recording(path, chunk_threshold=1) as rec:
        for _ in range(steps):
            cache = torch.full((64, 4096), 3.0, device=device)
            cache[5] = torch.arange(4096.0, device=device)
            write_row(cache, torch.full((4096,), 9.0, device=device), 10)
            rec.flush()  # each step hashed before the next one's stores are written
    assert rec.pieces.staged_bytes == 0


def test_a_store_of_bytes_the_recording_stored_before_takes_that_store_whole(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            device: str) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", ())
    record_steps(tmp_path / "untracked", device)
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    counts, fetched, reused = hashed_pieces(monkeypatch), fetched_pieces(monkeypatch), reused_lists(monkeypatch)
    record_steps(tmp_path / "tracked", device)
    assert contents(tmp_path / "tracked") == contents(tmp_path / "untracked")
    # the first step: before the row, the threes and the piece with the arange; after it, the row's
    # piece. The later steps' stores, before and after, are the first step's: nothing comes over
    assert counts == [2, 1] and fetched == counts and len(reused) == 4


@settings(max_examples=200, deadline=None)
@given(pieces=st.integers(1, 40), seed=st.integers(0, 2 ** 32 - 1), data=st.data())
def test_a_stores_content_key_names_its_checksums_place_by_place(pieces: int, seed: int, data: st.DataObject) -> None:
    # equal checksums, equal keys, read from the table's strided columns as from a copy; another
    # key for: a bit flipped in either checksum of one piece; one piece's checksums negated (an
    # int32 tensor negated negates both), their sign bits flipped, or replaced; the whole store
    # negated; two pieces' checksums swapped
    rows = np.random.default_rng(seed).integers(-2 ** 63, 2 ** 63 - 1, size=(pieces, piece_batch.ROW), dtype=np.int64)
    sums = rows[:, :2]
    key = chunk_changes.sums_key(sums)
    assert len(key) == 16 and chunk_changes.sums_key(sums.copy()) == key
    place, column = data.draw(st.integers(0, pieces - 1)), data.draw(st.integers(0, 1))
    bit = np.int64(1) << np.int64(data.draw(st.integers(0, 62)))
    drawn = np.array(data.draw(st.tuples(*[st.integers(-2 ** 63, 2 ** 63 - 1)] * 2)), dtype=np.int64)
    for change in (lambda t: t.__setitem__((place, column), t[place, column] ^ bit),
                   lambda t: t.__setitem__(place, -t[place]),
                   lambda t: t.__setitem__(place, t[place] ^ np.int64(-2 ** 63)),
                   lambda t: t.__setitem__(place, drawn),
                   lambda t: t.__setitem__(slice(None), -t)):
        changed = sums.copy()
        change(changed)
        if not np.array_equal(changed, sums):
            assert chunk_changes.sums_key(changed) != key
    other = data.draw(st.integers(0, pieces - 1))
    if not np.array_equal(sums[place], sums[other]):
        swapped = sums.copy()
        swapped[[place, other]] = swapped[[other, place]]
        assert chunk_changes.sums_key(swapped) != key


@replay.capture("piece_touch", mutates=("x",))
def piece_touch(x: torch.Tensor) -> None:
    x.add_(0)


def test_a_tensor_stored_negated_is_recorded_negated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     device: str) -> None:
    # negating an int32 tensor negates both checksums of each piece: a content key that mixed them
    # badly took `-t` for the store of `t` recorded just before (393a7c7, for a third of tensors)
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    for seed in (5, 21):  # both checksums odd, where that key always failed
        t = torch.randint(-1000, 1000, (PIECE // 4,), generator=torch.Generator().manual_seed(seed),
                          dtype=torch.int32).to(device)
        first, second = piece_sums.piece_sums(t.view(torch.uint8), None, stage=False)[0][0, :2].tolist()
        assert first % 2 == second % 2 == 1
        with replay.recording(tmp_path / f"seed{seed}", chunk_threshold=1) as recording:
            piece_touch(t.clone())
            recording.flush()
            piece_touch(-t)
        stored = [record.tensors for record in Snapshot(tmp_path / f"seed{seed}")]
        assert all(torch.equal(x.to(device), t) for x in stored[0].values())
        assert all(torch.equal(x.to(device), -t) for x in stored[1].values())


@replay.capture("piece_row_sums")
def row_sums(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=1)


def record_activations(path: Path, device: str, flush: bool = True, made: threading.Event | None = None,
                       **options) -> list[str]:
    """Fresh read-only inputs of 1 MiB (blobs), the second and fourth alike the first; the blob
    digests the calls refer to. `made` is set once the calls are made."""
    with replay.recording(path, **options) as rec:
        for fill in (1.0, 1.0, 2.0, 1.0):
            x = torch.full((64, 4096), fill, device=device)
            x[7, 9] = -fill
            row_sums(x)
            if flush:
                rec.flush()
        if made is not None:
            made.set()
    assert rec.pieces.staged_bytes == 0  # every staged blob was brought over or let go
    return [record.blobs["in/x"] for record in Snapshot(path)]


def blobs_brought_over(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes of each blob that came over from where it waited on the device."""
    sizes: list[int] = []
    real = chunk_changes.PieceHistory.whole

    def counting(self, take):
        host, buffer = real(self, take)
        sizes.append(len(host))
        return host, buffer
    monkeypatch.setattr(chunk_changes.PieceHistory, "whole", counting)
    return sizes


def test_a_large_read_only_input_waits_on_the_device_and_comes_over_only_if_new(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch,
                                                                              device: str) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", ())
    untracked = record_activations(tmp_path / "untracked", device)
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    brought = blobs_brought_over(monkeypatch)
    tracked = record_activations(tmp_path / "tracked", device)
    assert contents(tmp_path / "tracked") == contents(tmp_path / "untracked")
    assert tracked == untracked and tracked[0] == tracked[1] == tracked[3] != tracked[2]
    assert brought == [64 * 4096 * 4] * 2  # the first and the third: the others' checksums were stored


def test_a_blob_with_no_room_to_wait_on_the_device_comes_over_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      device: str) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", ())
    untracked = record_activations(tmp_path / "untracked", device)
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    monkeypatch.setattr(chunk_changes, "DEVICE_STAGING_BYTES", 0)
    brought = blobs_brought_over(monkeypatch)
    assert record_activations(tmp_path / "tracked", device) == untracked and brought == []


def blobs_copied_to_the_host(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes of each blob copied to the host at its call (not staged on the device)."""
    sizes: list[int] = []
    real = copies.Copier.copy

    def counting(self, t, landed=False, geometry=None):
        if landed:
            sizes.append(t.numel() * t.element_size())
        return real(self, t, landed, geometry)
    monkeypatch.setattr(copies.Copier, "copy", counting)
    return sizes


@pytest.mark.parametrize("when_full, writers", [("block", "late"), ("drop", "held"), ("block", "held")])
def test_past_the_staging_budget_a_blocking_recording_waits_for_the_writers(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch,
                                                                            device: str, when_full: str,
                                                                            writers: str) -> None:
    # room for one blob: a call waits until the writers let go of the one before (a host copy
    # would cost the program more), unless the recording drops rather than waits, or the writers
    # do not let go in time (held until the calls are made): then it copies to the host, as past
    # the budget without waiting, and does not wait again in vain
    if writers == "held":
        monkeypatch.setattr(chunk_changes, "STAGING_WAIT_S", 0.2)
    monkeypatch.setattr(chunk_changes, "DEVICES", ())
    untracked = record_activations(tmp_path / "untracked", device)
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    monkeypatch.setattr(chunk_changes, "DEVICE_STAGING_BYTES", 16 * PIECE)
    on_host = blobs_copied_to_the_host(monkeypatch)
    real = chunk_changes.PieceHistory.whole
    made = threading.Event()

    def lagging(self, take):
        if writers == "late":
            time.sleep(0.1)
        else:
            made.wait(timeout=60)
        return real(self, take)
    monkeypatch.setattr(chunk_changes.PieceHistory, "whole", lagging)
    # segment_seconds: no writer finds itself idle meanwhile, so only a waiting program hands its calls over
    tracked = record_activations(tmp_path / "tracked", device, flush=False, made=made, when_full=when_full,
                                 segment_seconds=60)
    assert tracked == untracked
    assert on_host == [] if writers == "late" else len(on_host) == 3  # all but the first


@replay.capture("piece_row_sums_or_fail")
def row_sums_or_fail(x: torch.Tensor, fail: bool) -> torch.Tensor:
    if fail:
        raise ValueError("as the test says")
    return x.sum(dim=1)


def test_a_call_that_fails_gives_back_the_device_memory_it_staged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 device: str) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    monkeypatch.setattr(chunk_changes, "DEVICE_STAGING_BYTES", 24 * PIECE)  # room for one blob of 16 pieces
    with replay.recording(tmp_path / "snap") as rec:
        for _ in range(3):  # each failed call's blob is dropped with its input: its staged bytes come back
            try:
                row_sums_or_fail(torch.full((64, 4096), 1.0, device=device), True)
            except ValueError:
                pass
            gc.collect()
            assert rec.pieces.staged_bytes == 0 and rec.pieces._in_making == 0
        row_sums_or_fail(torch.full((64, 4096), 2.0, device=device), False)  # staged, not waiting in vain
    (record,) = Snapshot(tmp_path / "snap")
    assert torch.equal(record.tensors["in/x"], torch.full((64, 4096), 2.0))


def test_the_stores_known_whole_forget_the_least_recently_met_first(monkeypatch: pytest.MonkeyPatch) -> None:
    # a cache whose bytes never repeat must not push out the activations each step meets again
    monkeypatch.setattr(chunk_changes, "SEEN_PIECES", 4)
    known = chunk_changes.KnownContent()
    known.remember_store(b"activation", ["a1", "a2"], "list-a")
    known.remember_store(b"cache, step 1", ["c1", "c2"], "list-c1")
    assert known.store(b"activation") == (["a1", "a2"], "list-a")  # met again: now the most recent
    known.remember_store(b"cache, step 2", ["c3", "c4"], "list-c2")
    assert known.store(b"cache, step 1") is None
    assert known.store(b"activation") is not None and known.store(b"cache, step 2") is not None


def test_the_memories_whose_last_store_is_kept_are_bounded(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    # a program storing ever new memory must not keep every store's checksums: the least recently
    # stored memory is forgotten, and its next store compares with nothing
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    monkeypatch.setattr(chunk_changes, "MEMORIES_KEPT", 2)
    spans = [torch.full((PIECE,), n, dtype=torch.uint8, device=device) for n in range(3)]
    tracker = chunk_changes.PieceTracker()
    batch = copies.piece_batch(torch.device(device), copies.SHARED_POOL)
    for n in (0, 1, 0, 2):  # 0 stored again after 1: 1 is the least recently stored when 2 comes
        tracker.observe(spans[n], False, batch)
        batch.flush()
    again = [tracker.observe(spans[n], False, batch) for n in (0, 1)]
    batch.flush()
    assert [history is not None and history.compared for history in again] == [True, False]
    assert len(tracker._last) == 2


def test_a_forgotten_memory_whose_store_was_dropped_unwritten_gives_its_bytes_back(
        monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    # the forgotten history's finalizer takes the tracker's lock: it must not run while observe holds it
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    monkeypatch.setattr(chunk_changes, "MEMORIES_KEPT", 1)
    tracker = chunk_changes.PieceTracker()
    batch = copies.piece_batch(torch.device(device), copies.SHARED_POOL)
    first, second = (torch.full((PIECE,), n, dtype=torch.uint8, device=device) for n in range(2))  # other memory
    assert tracker.observe(first, True, batch) is not None
    batch.flush()  # that store's call was dropped: the tracker holds its history alone
    thread = threading.Thread(target=tracker.observe, daemon=True, args=(second, True, batch))
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive() and tracker.staged_bytes == PIECE  # the second store's only


def test_a_store_copied_aside_is_written_whole_where_the_store_before_was_not(monkeypatch: pytest.MonkeyPatch,
                                                                                device: str) -> None:
    # its copy holds every piece: the pieces it shares with a store whose writer failed come over too
    span, tracker, batch, earlier = stored_once(monkeypatch, device, 3, seed=4)
    span[PIECE] ^= 1
    before = tracker.observe(span, True, batch, clone=True)
    batch.flush()
    assert before is not None and before.changed.tolist() == [0, 1, 0]
    earlier.hashed(None)  # its writer failed: the unchanged pieces' digests are not known
    found, known, _ = before.fetch(before.known(), lambda nbytes: torch.empty(nbytes, dtype=torch.uint8))
    assert known.digests == [None] * 3 and known.unknown == [0, 1, 2]
    assert np.array_equal(np.concatenate([piece for piece in found if piece is not None]), span.cpu().numpy())


def test_stores_dropped_before_their_launch_fail_whoever_reads_them(monkeypatch: pytest.MonkeyPatch,
                                                                    device: str) -> None:
    # a call given up before its checksums were launched: a writer reading them is told, not kept waiting
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    tracker = chunk_changes.PieceTracker()
    batch = copies.piece_batch(torch.device(device), copies.SHARED_POOL)
    history = tracker.observe(torch.zeros(PIECE, dtype=torch.uint8, device=device), False, batch)
    del batch
    gc.collect()
    read: list[BaseException] = []

    def reading() -> None:
        try:
            assert history is not None
            history.sums
        except RuntimeError as exc:
            read.append(exc)
    thread = threading.Thread(target=reading, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive() and len(read) == 1 and "dropped" in str(read[0])


def test_staging_buffers_are_reused_by_size_and_stream_and_kept_within_the_staging_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_runtime, "HOST_TWINS", ("cpu",))  # host memory kept as a GPU's is
    made: list[int] = []

    def allocate(nbytes: int, device: torch.device) -> torch.Tensor:
        made.append(nbytes)
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    held = {"bytes": 0}  # as the recording's staged stores are
    buffers = DeviceBuffers(allocate, 3 * PIECE, held=lambda: held["bytes"])
    cpu = torch.device("cpu")
    first, give_first = buffers.take(PIECE, cpu)
    second, give_second = buffers.take(PIECE, cpu)
    assert first.data_ptr() != second.data_ptr() and made == [PIECE, PIECE]  # both held: two buffers
    give_first()
    again, give_again = buffers.take(PIECE, cpu)
    assert again is first and made == [PIECE, PIECE]  # the one let go, taken again
    larger, give_larger = buffers.take(2 * PIECE, cpu)
    assert larger.numel() == 2 * PIECE and made[-1] == 2 * PIECE  # another size: a fresh one
    give_again(), give_second(), give_larger()
    assert buffers.free_bytes == 2 * PIECE  # the larger one passed the bound: back to torch
    held["bytes"] = 2 * PIECE  # staged stores hold two pieces: the kept ones and they pass the bound
    _, give_kept = buffers.take(PIECE, cpu)
    give_kept()
    assert buffers.free_bytes == PIECE  # not kept: back to torch
    buffers.clear()
    assert buffers.free_bytes == 0 and buffers.take(PIECE, cpu)[0] is not first


def test_a_fresh_staging_buffer_lets_kept_ones_go_the_sizes_taken_least_lately_first(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_runtime, "HOST_TWINS", ("cpu",))
    buffers = DeviceBuffers(lambda nbytes, device: torch.empty(nbytes, dtype=torch.uint8, device=device), 4 * PIECE)
    cpu = torch.device("cpu")
    small, give_small = buffers.take(PIECE, cpu)
    _, give_large = buffers.take(2 * PIECE, cpu)
    give_small(), give_large()
    again, give_again = buffers.take(PIECE, cpu)  # the small size taken again: the last to go
    assert again is small
    give_again()
    assert buffers.free_bytes == 3 * PIECE
    _, give_fresh = buffers.take(3 * PIECE, cpu)  # room for it: the large one goes, the small one stays
    assert buffers.free_bytes == PIECE and buffers.take(PIECE, cpu)[0] is small
    give_fresh()


def test_a_tracker_that_forgot_its_stores_is_freed_without_the_cycle_collector() -> None:
    tracker = chunk_changes.PieceTracker()
    tracker.forget()
    gone = weakref.ref(tracker)
    gc.disable()
    try:
        del tracker
        assert gone() is None
    finally:
        gc.enable()


def test_kept_staging_buffers_go_back_to_torch_when_an_allocation_finds_no_room(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_runtime, "HOST_TWINS", ("cpu",))
    room = {"full": False}

    def allocate(nbytes: int, device: torch.device) -> torch.Tensor:
        if room["full"]:
            room["full"] = False  # what the kept buffers gave back makes room, once
            raise torch.cuda.OutOfMemoryError("no room")
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    buffers = DeviceBuffers(allocate, 1 << 30)
    cpu = torch.device("cpu")
    _, give = buffers.take(PIECE, cpu)
    give()
    room["full"] = True
    buffer, _ = buffers.take(2 * PIECE, cpu)
    assert buffer.numel() == 2 * PIECE and buffers.free_bytes == 0
    room["full"] = True  # nothing kept: the program's memory comes first, the store is not staged
    with pytest.raises(torch.cuda.OutOfMemoryError):
        buffers.take(PIECE, cpu)


def test_a_staged_buffer_given_back_and_not_kept_is_freed_and_none_is_kept_once_the_recording_ends(
        monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    monkeypatch.setattr(cuda_runtime, "HOST_TWINS", ("cpu",))  # on a GPU, unused
    tracker = chunk_changes.PieceTracker()
    batch = copies.piece_batch(torch.device(device), copies.SHARED_POOL)
    memory = torch.zeros(4 * PIECE, dtype=torch.uint8, device=device)
    tracker.buffers.max_bytes = 0  # as if the kept ones were at their bound
    history = tracker.observe(memory, True, batch)
    batch.flush()
    assert history is not None and history.staged is not None
    staged = weakref.ref(history.staged)
    history.hashed(None)  # the writer is done with it; the history stays, the memory's last store
    gc.collect()
    assert staged() is None and tracker.staged_bytes == 0  # not held by what gave it back
    tracker.buffers.max_bytes = 1 << 30
    later = tracker.observe(memory, True, batch)
    batch.flush()
    tracker.forget()  # the recording ends while a writer still has this store
    assert later is not None
    later.hashed(None)
    assert tracker.buffers.free_bytes == 0  # given back after the end: to torch, not kept


def test_checksums_launched_and_never_read_give_their_pinned_buffer_back_only_once_the_launch_ran() -> None:
    # the kernel reads its table and writes its checksums in the pinned buffer in place: a call
    # abandoned after its launch must not hand the buffer to the next take while it may still run
    order: list[str] = []

    class Ran:
        def synchronize(self) -> None:
            order.append("waited")
    checksums = piece_batch.Checksums()
    checksums.launched(torch.zeros(3 * 8, dtype=torch.uint8), torch.zeros(64, dtype=torch.uint8),
                       lambda buffer: order.append("given back"), Ran())
    checksums.failed(RuntimeError("the call was abandoned"))
    del checksums
    gc.collect()
    assert order == ["waited", "given back"]


@pytest.mark.gpu
def test_on_a_gpu_an_unread_launch_is_waited_for_before_its_pinned_buffer_goes_back(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", ("cuda",))
    given: list[bool] = []
    pool = copies.PinnedPool()

    def give(buffer: torch.Tensor) -> None:
        given.append(torch.cuda.current_stream().query())  # the launch, queued behind the sleep, has run
        pool.give(buffer)
    batch = piece_batch.PieceBatch(torch.device("cuda"), pool.take, give,
                                   lambda nbytes: (torch.empty(nbytes, dtype=torch.uint8, device="cuda"), lambda: None))
    tracker = chunk_changes.PieceTracker()
    memory = torch.zeros(4 * PIECE, dtype=torch.uint8, device="cuda")
    torch.cuda._sleep(200_000_000)  # the launch waits behind ~0.1 s of device time
    history = tracker.observe(memory, False, batch)
    batch.launch()  # issued, never landed: its call was abandoned
    assert history is not None
    tracker.forget()
    del history, batch
    gc.collect()
    assert given == [True]


def test_a_written_store_lets_go_of_its_checksums_while_its_segment_is_still_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    # the open segment holds its calls until written (up to segment_seconds): their checksums' device
    # and pinned memory must not wait with them, or every step takes new ones meanwhile
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    monkeypatch.setattr(cuda_runtime, "HOST_TWINS", ("cpu",))  # on a GPU, unused
    made: list[weakref.ref] = []
    real = piece_batch.Checksums.__init__

    def counted(self: piece_batch.Checksums) -> None:
        real(self)
        made.append(weakref.ref(self))
    monkeypatch.setattr(piece_batch.Checksums, "__init__", counted)
    cache = torch.zeros(64, 4096, device=device)
    with replay.recording(tmp_path / "snap", chunk_threshold=1, segment_seconds=60) as recording:
        for step in range(12):
            write_row(cache, torch.full((4096,), float(step + 1), device=device), step)
        recording.calls.hand_off()
        deadline = time.monotonic() + 30
        while recording.calls._taken < 12 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert recording.calls._taken == 12 and recording.calls.written == 0  # all in the open segment
        gc.collect()
        assert len(made) >= 12 and sum(ref() is not None for ref in made) <= 2  # the last store's, to compare with
    calls = list(Snapshot(tmp_path / "snap"))
    assert [float(call.tensors["out/cache"][step, 0]) for step, call in enumerate(calls)] == \
        [float(step + 1) for step in range(12)]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_a_byte_budget_counts_staged_stores_written_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            device: str, asynchronous: bool) -> None:
    # written on the calling thread, a call's copies are released before the budget counts them
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    monkeypatch.setattr(cuda_runtime, "HOST_TWINS", ("cpu",))  # on a GPU, unused
    cache = torch.zeros(64, 4096, device=device)  # 1 MiB: in and out staged, 2 MiB a call
    with replay.recording(tmp_path / "snap", chunk_threshold=1, asynchronous=asynchronous,
                          max_bytes=5 << 20) as recording:
        for step in range(4):
            write_row(cache, torch.full((4096,), float(step + 1), device=device), step)
    assert recording.stopped and len(Snapshot(tmp_path / "snap")) == 3  # the third call spent the budget


def test_a_store_unchanged_since_the_one_before_takes_its_content_key_unhashed(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch,
                                                                              device: str) -> None:
    # a cache a call rewrites with what it held: every store after the first call is the one
    # before, its list and its content key (no pass over its checksums on the writer's side)
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    keyed: list[int] = []  # the pieces of each store whose content key was worked out from its checksums
    real = chunk_changes.PieceHistory.content_key

    def counting(self):
        if self._key is None:
            keyed.append(self.place.pieces)
        return real(self)
    monkeypatch.setattr(chunk_changes.PieceHistory, "content_key", counting)
    reused = reused_lists(monkeypatch)
    row = torch.full((4096,), 9.0, device=device)
    with replay.recording(tmp_path / "same", chunk_threshold=1) as rec:
        cache = torch.full((64, 4096), 3.0, device=device)
        for _ in range(4):
            write_row(cache, row, 10)
            rec.flush()
    # the first call's stores: before it (nothing to compare with) and after it (a row changed)
    assert keyed == [16, 16] and len(reused) == 6


def test_a_store_of_few_changed_pieces_moves_the_key_of_the_store_before(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch,
                                                                         device: str) -> None:
    # a decode step's row of a cache: its store's key is the store before's, moved by the terms of
    # the pieces that changed, and the very key a pass over all its checksums gives; that pass is
    # made only for the first call's stores, which compare with nothing
    monkeypatch.setattr(chunk_changes, "DEVICES", (device,))
    full = chunk_changes.sums_key
    passes: list[int] = []  # the pieces of each store keyed by a pass over its checksums
    moved: list[bool] = []  # each key moved from the store before's: whether it is the pass's
    monkeypatch.setattr(chunk_changes, "sums_key", lambda sums: passes.append(len(sums)) or full(sums))
    real = chunk_changes.PieceHistory._key_from_previous

    def checked(self: chunk_changes.PieceHistory) -> bytes | None:
        key = real(self)
        if key is not None:
            moved.append(key == full(self.sums) + self.nbytes.to_bytes(8, "little"))
        return key
    monkeypatch.setattr(chunk_changes.PieceHistory, "_key_from_previous", checked)
    with replay.recording(tmp_path / "snap", chunk_threshold=1) as rec:
        cache = torch.zeros(64, 4096, device=device)  # 16 pieces, a row a quarter of one
        for step in range(6):
            write_row(cache, torch.full((4096,), step + 1.0, device=device), step * 9)
            rec.flush()
    # each later call's store after it moves the key of the store before it, which is the last
    # call's after, unchanged, whose key it takes whole
    assert passes == [16, 16] and moved == [True] * 5
    calls = list(Snapshot(tmp_path / "snap"))
    assert [float(call.tensors["out/cache"][step * 9, 0]) for step, call in enumerate(calls)] == \
        [step + 1.0 for step in range(6)]


@settings(max_examples=200, deadline=None)
@given(pieces=st.integers(1, 40), seed=st.integers(0, 2 ** 32 - 1), data=st.data())
def test_a_key_moved_by_changed_rows_is_the_key_of_the_rows_after(pieces: int, seed: int,
                                                                 data: st.DataObject) -> None:
    generator = np.random.default_rng(seed)
    before = generator.integers(-2 ** 63, 2 ** 63 - 1, size=(pieces, piece_batch.ROW), dtype=np.int64)
    changed = np.array(sorted(data.draw(st.sets(st.integers(0, pieces - 1)))), dtype=np.int64)
    after = before.copy()
    after[changed, :2] = generator.integers(-2 ** 63, 2 ** 63 - 1, size=(len(changed), 2), dtype=np.int64)
    key = chunk_changes.moved_key(chunk_changes.sums_key(before[:, :2]), before[changed, :2], after[changed, :2],
                                  changed)
    assert key == chunk_changes.sums_key(after[:, :2])  # the table's strided columns, as the writer reads them


@settings(max_examples=200, deadline=None)
@given(pieces=st.integers(1, chunk_changes._FEW_TERMS), seed=st.integers(0, 2 ** 32 - 1))
def test_a_few_pieces_terms_in_python_ints_are_numpys_bits(pieces: int, seed: int) -> None:
    generator = np.random.default_rng(seed)
    rows = generator.integers(-2 ** 63, 2 ** 63 - 1, size=(pieces, piece_batch.ROW), dtype=np.int64)[:, :2]
    places = generator.integers(0, 2 ** 63, size=pieces, dtype=np.uint64)
    few = chunk_changes._terms(rows, places)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunk_changes, "_FEW_TERMS", 0)  # every piece through numpy
        assert chunk_changes._terms(rows, places) == few
