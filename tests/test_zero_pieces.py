"""Pieces of zeros are named without hashing: the digest a zero piece has is known by its length.
An output buffer's mask of unchanged elements is all zeros wherever its kernel wrote everything,
so a recording's writers would otherwise hash megabytes of zeros at every step."""
from __future__ import annotations

from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import replay
from replay.snapshot import Snapshot, hashing
from replay.snapshot.writer import CHUNK_BYTES, SnapshotWriter

hash_here = hashing.hash_pieces_here  # hashing's own, whatever a test patches


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.tuples(st.booleans(), st.booleans()), min_size=1, max_size=8),
       piece_bytes=st.sampled_from([8, 24, 64, 100]), tail=st.integers(0, 99), offset=st.integers(0, 7),
       data=st.data())
def test_a_piece_of_zeros_gets_the_digest_hashing_gives_it_without_being_hashed(
        lengths: list[tuple[bool, bool]], piece_bytes: int, tail: int, offset: int, data: st.DataObject) -> None:
    """Bytes of any alignment cut into pieces (the last maybe short), each written (one nonzero
    byte somewhere) or zeros, and known already or not: known_zeros names exactly the pieces of
    zeros, with the digest hashing gives them, and only the unknown written pieces are hashed."""
    count = len(lengths)
    size = count * piece_bytes + min(tail, piece_bytes - 1)
    raw = np.zeros(size + offset, dtype=np.uint8)[offset:]
    cut = [raw[start:start + piece_bytes] for start in range(0, size, piece_bytes)]
    written = [written for written, _ in lengths] + [data.draw(st.booleans())] * (len(cut) - count)
    for piece, is_written in zip(cut, written):
        if is_written:
            piece[data.draw(st.integers(0, len(piece) - 1))] = data.draw(st.integers(1, 255))
    truth = hash_here(cut)
    zeros = hashing.known_zeros(raw, piece_bytes)
    assert zeros == [None if is_written else digest for digest, is_written in zip(truth, written)]
    is_known = [known for _, known in lengths] + [False] * (len(cut) - count)
    known = [digest if knew else zero for digest, knew, zero in zip(truth, is_known, zeros)]
    hashed: list[int] = []
    with mock.patch.object(hashing, "hash_pieces_here", lambda some: (hashed.append(len(some)), hash_here(some))[1]):
        assert hashing.piece_digests(cut, known) == truth
    assert sum(hashed) == sum(is_written and not knew for is_written, knew in zip(written, is_known))


@given(st.lists(st.one_of(st.none(), st.text(max_size=2), st.integers(), st.just(False), st.just(b""))))
def test_nones_finds_exactly_the_places_of_none(values: list[object]) -> None:
    # what a store's writer asks of its list of known digests (one a piece: long): falsy values are not None
    assert hashing.nones(values) == [n for n, value in enumerate(values) if value is None]


def test_a_chunked_tensor_of_zeros_is_stored_with_only_its_written_piece_hashed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hashed: list[int] = []
    monkeypatch.setattr(hashing, "hash_pieces_here", lambda pieces: (hashed.append(len(pieces)), hash_here(pieces))[1])
    span = torch.zeros(3 * CHUNK_BYTES + 100, dtype=torch.uint8)
    span[CHUNK_BYTES + 5] = 7  # one written piece among zeros
    writer = SnapshotWriter(tmp_path / "snap")
    listed, digests = writer.put_chunks(span)
    assert sum(hashed) == 1  # the written piece only (the list itself is a blob, hashed apart)
    assert digests[0] == digests[2] != digests[1]
    assert digests[3] == hash_here([np.zeros(100, np.uint8)])[0]
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
