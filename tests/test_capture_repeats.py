"""An untracked chunked store (host memory's, an output buffer's mask) is compared with the last
store of its site, and its pieces alike that store's take their digests without being hashed
(replay/recorder/repeats.py): what a writer hashes is what changed, and what is read back is
still the bytes each call saw."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import replay
from replay.recorder import cuda_runtime, graphs, repeats
from replay.recorder.copies import HostCopy
from replay.recorder.staging import CallSpec, Tensor
from replay.snapshot import Snapshot, hashing
from replay.snapshot.tensors import geometry_of, storage_span
from replay.snapshot.writer import CHUNK_BYTES, cut_bytes
from test_capture_piece_changes import hashed_pieces

PIECES = 6


@replay.capture("repeats_write_row", mutates=("cache",))
def write_row(cache: torch.Tensor, row: int, value: float) -> None:
    cache[row] = value


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return hashed_pieces(monkeypatch)


def test_a_repeated_store_hashes_only_the_pieces_that_changed_and_reads_back_exactly(tmp_path: Path, hashed) -> None:
    cache = torch.arange(PIECES * CHUNK_BYTES // 4, dtype=torch.float32).reshape(PIECES, -1)  # a row a piece
    seen = []
    with replay.recording(tmp_path / "snap", chunk_threshold=1, asynchronous=False):
        for row, value in [(1, -1.0), (1, -1.0), (4, -2.0)]:
            seen.append(cache.clone())
            write_row(cache, row, value)
    # per call, its input then its output, each compared with the same key's last store: call 1 hashes
    # all; call 2's input differs from call 1's in row 1 and its output not at all; call 3's input
    # is call 2's, its output differs in row 4 (every piece was hashed each time before)
    assert hashed == [PIECES, PIECES, 1, 0, 0, 1]
    calls = list(Snapshot(tmp_path / "snap"))
    for call, before in zip(calls, seen):
        assert torch.equal(call.tensors["in/cache"], before)
    assert torch.equal(calls[-1].tensors["out/cache"], cache)


def host_copy(data: torch.Tensor, pooled: bool) -> HostCopy:
    """A landed host copy of `data`'s bytes: in a buffer standing for a pooled one, or a clone."""
    buffer = data.reshape(-1).view(torch.uint8).clone()
    return (HostCopy(None, geometry_of(buffer), buffer=buffer) if pooled
            else HostCopy(buffer, geometry_of(buffer), own_memory=True))


def store(kept: repeats.Repeats, site, data: torch.Tensor, pooled: bool = True) -> list[str | None]:
    """What `kept` knows of a store of `data` at `site`, which is then kept as stored."""
    copy = host_copy(data, pooled)
    raw = copy.span.numpy()
    known = kept.known(site, raw)
    digests = hashing.piece_digests(cut_bytes(raw), known)
    kept.keep(site, copy, raw, digests)
    assert (copy.buffer is None) == (len(raw) <= kept.max_bytes)  # a kept store's buffer is no longer the copy's
    return known


def test_pieces_alike_the_sites_last_store_are_known_and_the_rest_not() -> None:
    given: list[torch.Tensor] = []
    kept = repeats.Repeats(given.append)
    data = torch.randint(1, 255, (PIECES * CHUNK_BYTES + 100,), dtype=torch.uint8)  # a short last piece
    assert store(kept, ("op", "kept/out"), data) == [None] * (PIECES + 1)
    changed = data.clone()
    changed[2 * CHUNK_BYTES + 5] ^= 1
    changed[-1] ^= 1
    known = store(kept, ("op", "kept/out"), changed)
    expected = hashing.piece_digests(cut_bytes(changed.numpy()))
    assert [n for n, digest in enumerate(known) if digest is None] == [2, PIECES]
    assert [d for d in known if d is not None] == [d for n, d in enumerate(expected) if n not in (2, PIECES)]
    assert len(given) == 1  # the first store's buffer, let go as the second took its place
    assert store(kept, ("op", "kept/other"), changed) == [None] * (PIECES + 1)  # another site: nothing known
    assert store(kept, ("op", "kept/out"), changed[:-1]) == [None] * (PIECES + 1)  # another length: nothing


def test_zero_pieces_are_known_whatever_the_last_store_held() -> None:
    kept = repeats.Repeats(lambda buffer: None)
    data = torch.ones(3 * CHUNK_BYTES, dtype=torch.uint8)
    store(kept, ("op", "state/x"), data)
    ones = hashing.piece_digests(cut_bytes(data.numpy()))[0]
    data[CHUNK_BYTES:2 * CHUNK_BYTES] = 0  # changed, to zeros: known without hashing
    data[2 * CHUNK_BYTES:] = 3  # changed: hashed
    assert store(kept, ("op", "state/x"), data) == [ones, hashing.zero_digest(CHUNK_BYTES), None]


def test_kept_bytes_are_bounded_the_least_lately_stored_let_go_first_and_all_at_close() -> None:
    given: list[torch.Tensor] = []
    kept = repeats.Repeats(given.append, max_bytes=2 * CHUNK_BYTES)
    first, second = torch.ones(CHUNK_BYTES, dtype=torch.uint8), torch.full((CHUNK_BYTES,), 2, dtype=torch.uint8)
    store(kept, ("op", "a"), first)
    store(kept, ("op", "b"), second)
    store(kept, ("op", "c"), second)  # past the bound: "a" goes
    assert kept.kept_bytes == 2 * CHUNK_BYTES and len(given) == 1 and torch.equal(given[0], first)
    assert store(kept, ("op", "a"), first) == [None]  # forgotten
    store(kept, ("op", "huge"), torch.ones(3 * CHUNK_BYTES, dtype=torch.uint8))  # larger than the bound: not kept
    assert kept.kept_bytes == 2 * CHUNK_BYTES
    kept.close()
    assert kept.kept_bytes == 0 and len(given) == 4  # "a", "b" (pushed out by "a" again), then "c" and "a"


def test_an_unpooled_copy_is_kept_by_reference_and_nothing_is_given_back() -> None:
    given: list[torch.Tensor] = []
    kept = repeats.Repeats(given.append)
    data = torch.full((2 * CHUNK_BYTES,), 7, dtype=torch.uint8)
    store(kept, ("op", "in/x"), data, pooled=False)
    assert store(kept, ("op", "in/x"), data, pooled=False) == hashing.piece_digests(cut_bytes(data.numpy()))
    kept.close()
    assert given == []


def test_a_view_into_memory_given_back_elsewhere_is_never_kept() -> None:
    kept = repeats.Repeats(lambda buffer: None)
    slab = torch.full((4 * CHUNK_BYTES,), 5, dtype=torch.uint8)  # a graph replay's: the next replay reuses it
    for _ in range(2):
        view = HostCopy(slab[CHUNK_BYTES:3 * CHUNK_BYTES], geometry_of(slab[:2 * CHUNK_BYTES]))
        raw = view.span.numpy()
        assert kept.known(("op", "state/cache"), raw) == [None, None]
        kept.keep(("op", "state/cache"), view, raw, hashing.piece_digests(cut_bytes(raw)))
        assert kept.kept_bytes == 0


def test_after_close_a_late_store_keeps_nothing_and_its_buffer_stays_with_its_copy() -> None:
    given: list[torch.Tensor] = []
    kept = repeats.Repeats(given.append)
    kept.close()
    copy = host_copy(torch.ones(CHUNK_BYTES, dtype=torch.uint8), pooled=True)
    raw = copy.span.numpy()
    kept.keep(("op", "late"), copy, raw, hashing.piece_digests(cut_bytes(raw)))
    assert copy.buffer is not None and kept.kept_bytes == 0 and given == []  # the writer gives it back


def test_the_bound_counts_a_kept_buffers_whole_size() -> None:
    kept = repeats.Repeats(lambda buffer: None)
    buffer = torch.ones(4 * CHUNK_BYTES, dtype=torch.uint8)  # pooled sizes are powers of two
    copy = HostCopy(buffer[:CHUNK_BYTES + 1], geometry_of(buffer[:CHUNK_BYTES + 1]), buffer=buffer)
    raw = copy.span.numpy()
    kept.keep(("op", "kept/out"), copy, raw, hashing.piece_digests(cut_bytes(raw)))
    assert kept.kept_bytes == 4 * CHUNK_BYTES


@pytest.mark.parametrize("pooled", [False, True], ids=["clones", "pooled buffers, as on a GPU"])
def test_each_graph_replay_is_read_back_as_it_left_the_staged_tensor(tmp_path: Path, monkeypatch, pooled) -> None:
    """A replay's calls are views into its slab, which goes back to the pool once written and is
    the next replay's: a store kept by reference would compare the next replay with itself."""
    if pooled:
        monkeypatch.setattr(cuda_runtime, "HOST_TWINS", ("cpu",))
    cache = torch.zeros(4 * CHUNK_BYTES // 4, dtype=torch.float32)
    tape = graphs.Tape(graph_id=9)
    staged = tape.stage(Tensor("state/cache", "argument 'cache'", cache, geometry_of(cache), persistent=True))
    header = {"op": "repeats_graph_fill", "variant": "default", "provider": __name__,
              "args": [{"name": "cache", "tensor": "state/cache"}], "returns_json": {}, "launch": [],
              "meta": {"thread": "MainThread", "scope": {}, "graph": 9}}
    tape.calls.append(graphs.CapturedCall(CallSpec("repeats_graph_fill", "default", __name__), header, [staged]))
    with replay.recording(tmp_path / "snap", chunk_threshold=1, asynchronous=False) as recording:
        for step in range(4):
            cache.fill_(float(step + 1))
            staged.tensor.copy_(storage_span(cache))  # what the graph's staging copy does at a replay
            recording.record_replay(tape)
    read = [record.tensors["state/cache"] for record in Snapshot(tmp_path / "snap")]
    assert [float(t.view(torch.float32)[0]) for t in read] == [1.0, 2.0, 3.0, 4.0]


def test_pieces_alike_are_found_at_any_alignment() -> None:
    """Bytes starting at an odd address are compared a byte at a time, not eight."""
    kept = repeats.Repeats(lambda buffer: None)
    backing = torch.randint(1, 255, (3 * CHUNK_BYTES + 1,), dtype=torch.uint8)
    first = HostCopy(backing[1:], geometry_of(backing[1:]), own_memory=True)
    raw = first.span.numpy()
    assert raw.ctypes.data % 8 != 0
    digests = hashing.piece_digests(cut_bytes(raw))
    kept.keep(("op", "in/x"), first, raw, digests)
    changed = backing.clone()
    changed[1 + CHUNK_BYTES + 3] ^= 1  # in the second piece
    assert kept.known(("op", "in/x"), changed[1:].numpy()) == [digests[0], None, digests[2]]
