"""Which pieces of a chunked tensor changed since its last store is decided where the tensor
lives (replay/recorder/chunk_changes.py): only those are hashed on the host. On a GPU that is the
default; here the same logic runs on CPU tensors (chunk_changes.DEVICES gains "cpu"), and the
snapshot must be the very one recorded without it."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import replay
from replay.recorder import chunk_changes
from replay.snapshot import Snapshot, hashing, writer

PIECE = writer.CHUNK_BYTES


@replay.capture("piece_write_row", mutates=("cache",))
def write_row(cache: torch.Tensor, row: torch.Tensor, position: int) -> None:
    cache[position] = row


def test_checksums_flag_exactly_the_pieces_that_differ() -> None:
    gen = torch.Generator().manual_seed(0)
    raw = torch.randint(0, 256, (5 * PIECE + 4096,), generator=gen, dtype=torch.uint8)  # a partial last piece
    before = chunk_changes.piece_checksums(raw)
    assert before.shape == (6, 2) and torch.equal(before, chunk_changes.piece_checksums(raw.clone()))
    for at in (0, 3 * PIECE + 17, raw.numel() - 1):
        changed = raw.clone()
        changed[at] ^= 1
        flags = (chunk_changes.piece_checksums(changed) != before).any(1)
        assert flags.nonzero().flatten().tolist() == [at // PIECE]


def record_decode(path: Path, device: str, steps: int = 6) -> torch.Tensor:
    cache = torch.zeros(64, 4096, device=device)  # 1 MiB: 16 pieces, a row a quarter of one
    with replay.recording(path, chunk_threshold=1):
        for step in range(steps):
            write_row(cache, torch.full((4096,), float(step + 1), device=device), step * 9)
    return cache


def hashed_pieces(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many pieces each store hashed."""
    counts: list[int] = []
    real = hashing.hash_pieces

    def counting(pieces):
        counts.append(len(pieces))
        return real(pieces)
    monkeypatch.setattr(hashing, "hash_pieces", counting)
    return counts


def contents(path: Path) -> list[tuple[str, list[float]]]:
    return [(key, t.cpu().flatten().tolist()) for record in Snapshot(path) for key, t in record.tensors.items()]


def check_only_changed_pieces_are_hashed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    monkeypatch.setattr(chunk_changes, "DEVICES", ())
    record_decode(tmp_path / "untracked", device)
    monkeypatch.setattr(chunk_changes, "DEVICES", ("cpu", "cuda"))
    counts = hashed_pieces(monkeypatch)
    cache = record_decode(tmp_path / "tracked", device)
    assert contents(tmp_path / "tracked") == contents(tmp_path / "untracked")
    # each call stores the cache before its row (as the last call left it: nothing to hash) and after
    # (the one piece the row lands in); the first store hashes every piece
    assert counts == [16, 1] + [0, 1] * 5
    last = list(Snapshot(tmp_path / "tracked"))[-1]
    assert torch.equal(last.tensors["out/cache"], cache.cpu())


def test_only_the_pieces_a_call_changed_are_hashed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_only_changed_pieces_are_hashed(tmp_path, monkeypatch, "cpu")


@pytest.mark.gpu
def test_only_the_pieces_a_call_changed_are_hashed_on_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_only_changed_pieces_are_hashed(tmp_path, monkeypatch, "cuda")


def test_a_flight_recording_that_forgets_stores_still_writes_what_it_holds(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # the stores the ring forgot are never hashed: the ones it holds must not wait for them
    monkeypatch.setattr(chunk_changes, "DEVICES", ("cpu",))
    cache = torch.zeros(64, 4096)
    with replay.recording(tmp_path / "snap", chunk_threshold=1, ring=3):
        for step in range(10):
            write_row(cache, torch.full((4096,), float(step + 1)), step)
        replay.dump()
    records = list(Snapshot(tmp_path / "snap"))
    assert [r.arguments()["position"] for r in records] == [7, 8, 9]
    assert torch.equal(records[-1].tensors["out/cache"], cache)
