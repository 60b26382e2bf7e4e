"""Pieces of zeros are named without hashing: the digest a zero piece has is known by its length.
An output buffer's mask of unchanged elements is all zeros wherever its kernel wrote everything,
so a recording's writers would otherwise hash megabytes of zeros at every step."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import replay
from replay.snapshot import Snapshot, hashing
from replay.snapshot.writer import CHUNK_BYTES, SnapshotWriter

PIECE = 64  # bytes: small pieces, so that short arrays have many


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(st.booleans(), min_size=1, max_size=9), tail=st.integers(0, PIECE - 1),
       offset=st.integers(0, 7), data=st.data())
def test_the_zero_pieces_are_those_hashing_names_as_zeros(pieces: list[bool], tail: int, offset: int,
                                                          data: st.DataObject) -> None:
    """Each piece written or zeros as drawn (a short last one too, at any alignment): a zero piece's
    digest is the one hashing gives it, a written one is left to hashing, and None means none is zero."""
    length = len(pieces) * PIECE + tail
    raw = np.zeros(length + offset, dtype=np.uint8)[offset:]
    for n, written in enumerate(pieces + [tail > 0 and data.draw(st.booleans())]):
        if written and n * PIECE < length:
            at = data.draw(st.integers(n * PIECE, min(length, (n + 1) * PIECE) - 1))
            raw[at] = data.draw(st.integers(1, 255))
    cut = [raw[start:start + PIECE] for start in range(0, length, PIECE)]
    expected = [None if piece.any() else digest for piece, digest in zip(cut, hashing.hash_pieces_here(cut))]
    found = hashing.zero_pieces(raw, PIECE)
    assert found == (None if all(digest is None for digest in expected) else expected)


def test_a_chunked_tensor_of_zeros_is_stored_with_only_its_written_piece_hashed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hashed: list[int] = []
    hash_here = hashing.hash_pieces_here
    monkeypatch.setattr(hashing, "hash_pieces_here", lambda pieces: (hashed.append(len(pieces)), hash_here(pieces))[1])
    span = torch.zeros(3 * CHUNK_BYTES + 100, dtype=torch.uint8)
    span[CHUNK_BYTES + 5] = 7  # one written piece among zeros
    writer = SnapshotWriter(tmp_path / "snap")
    listed, digests = writer.put_chunks(span)
    assert sum(hashed) == 1  # the written piece only (the list itself is a blob, hashed apart)
    assert digests[0] == digests[2] != digests[1]
    assert digests[3] == hashing.hash_pieces_here([np.zeros(100, np.uint8)])[0]
    writer.close()
    assert (tmp_path / "snap" / "blobs").exists() and listed


@replay.capture("zero_pieces_fill", mutates=("state",))
def fill_(state: torch.Tensor, value: float) -> None:
    state[: state.numel() // 2].fill_(value)


def test_a_recorded_state_of_zeros_replays(tmp_path: Path) -> None:
    """A chunked state (zeros, then half written) recorded and replayed: the zero pieces named by
    length are the very bytes the snapshot reads back."""
    state = torch.zeros(1 << 20, dtype=torch.float32)  # 4 MiB: chunked
    with replay.recording(tmp_path / "snap", asynchronous=False):
        fill_(state, 0.0)
        fill_(state, 3.0)
    calls = list(Snapshot(tmp_path / "snap"))
    assert len(calls) == 2
    assert torch.equal(calls[1].tensors["in/state"], torch.zeros(1 << 20))
    after = calls[1].tensors["out/state"]
    assert torch.equal(after[: 1 << 19], torch.full((1 << 19,), 3.0)) and not after[1 << 19:].any()
