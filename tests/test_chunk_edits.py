"""Format 6: a store of a chunked tensor that changed a few pieces names the last whole list of
its tensor and the rows that differ, not a whole list (36 bytes a piece) again; the reader puts
the list back together and refuses edits that are not edits of it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import replay
from replay.errors import SnapshotError
from replay.snapshot import Snapshot, SnapshotWriter, chunk_lists, hashing
from replay.snapshot.writer import CHUNK_BYTES

PIECES = 256  # a 16 MiB cache: whole lists of 9 KB, edits of at most 22 rows
ROW_FLOATS = CHUNK_BYTES // 4  # a position's row is one piece


@replay.capture("edits_write_row", mutates=("cache",))
def write_row(cache: torch.Tensor, row: torch.Tensor, position: int) -> None:
    cache[position] = row


def decode(path: Path, steps: int) -> list[torch.Tensor]:
    """A decode loop writing one piece a step into a cache of PIECES pieces; the cache after each step."""
    cache = torch.zeros(PIECES, ROW_FLOATS)
    seen = []
    with replay.recording(path, asynchronous=False):
        for step in range(steps):
            write_row(cache, torch.full((ROW_FLOATS,), float(step + 1)), step)
            seen.append(cache.clone())
    return seen


def descriptions(path: Path) -> list[dict]:
    """Each call's tensors as its segment describes them."""
    from replay.snapshot import callfile

    found = {}
    for segment in sorted((path / "segments").iterdir()):
        data = segment.read_bytes()
        for name, text in callfile.read_metadata(data).items():
            header = json.loads(text)
            found[header["index"]] = header["tensors"]
    return [found[index] for index in sorted(found)]


def test_a_decode_loop_stores_edits_of_one_list_and_reads_every_step_back(tmp_path: Path) -> None:
    steps = 30  # past most_edits(256) = 22 changed rows: the lineage takes a new whole list
    seen = decode(tmp_path / "snap", steps)
    calls = list(Snapshot(tmp_path / "snap"))
    assert len(calls) == steps
    for step, (call, after) in enumerate(zip(calls, seen)):
        assert torch.equal(call.tensors["out/cache"], after), step
        before = seen[step - 1] if step else torch.zeros_like(after)
        assert torch.equal(call.tensors["in/cache"], before), step
        assert torch.equal(call.tensors["in/row"], torch.full((ROW_FLOATS,), float(step + 1))), step
    described = descriptions(tmp_path / "snap")
    ins, outs = [d["in/cache"] for d in described], [d["out/cache"] for d in described]
    # the cache of zeros before the first step is the whole list; each step after edits it, until
    # the 23rd changes 23 rows, past most_edits(256) = 22: a new whole list
    assert "chunk_edits" not in ins[0]
    assert all("chunk_edits" in out and out["chunks"] == ins[0]["chunks"] for out in outs[:22])
    assert "chunk_edits" not in outs[22] and outs[22]["chunks"] != ins[0]["chunks"]
    assert "chunk_edits" in outs[23] and outs[23]["chunks"] == outs[22]["chunks"]
    # the cache before a step is the list after the step before: the same whole list, edited alike
    assert all(ins[step]["chunks"] == outs[step - 1]["chunks"]
               and ("chunk_edits" in ins[step]) == ("chunk_edits" in outs[step - 1]) for step in range(1, steps))
    manifest = json.loads((tmp_path / "snap" / "manifest.json").read_text())
    assert manifest["format_version"] == 6


def test_a_decode_step_stores_its_edits_in_its_call_not_a_list_in_a_file(tmp_path: Path) -> None:
    steps = 16
    decode(tmp_path / "snap", steps)
    outs = [tensors["out/cache"] for tensors in descriptions(tmp_path / "snap")]
    assert all(out["chunk_edits"] == "edits/out/cache" for out in outs)
    # each step's new row (its one piece, stored in pieces with the cache's) edits the first row's list
    rows = [tensors["in/row"] for tensors in descriptions(tmp_path / "snap")]
    assert "chunk_edits" not in rows[0] and all(row["chunk_edits"] == "edits/in/row" for row in rows[1:])
    blobs = sorted((tmp_path / "snap" / "blobs").iterdir())
    whole = PIECES * chunk_lists.ROW
    # two lists in files for the whole loop: the cache's (whole) and the first row's (one piece)
    assert sorted(blob.stat().st_size >= whole for blob in blobs) == [False, True]
    # 16 steps' edits of 1..16 rows, 40 bytes each, in the segments: not 16 whole lists
    segments = sum(segment.stat().st_size for segment in (tmp_path / "snap" / "segments").iterdir())
    assert segments < steps * whole / 3


@replay.capture("edits_row_sums")
def row_sums(cache: torch.Tensor) -> torch.Tensor:
    return cache.sum(dim=1)


def test_a_read_of_a_cache_stored_in_chunks_is_stored_in_chunks_too(tmp_path: Path) -> None:
    """A decode step's attention reads the cache the step wrote a row of: stored whole as a blob,
    that read would cost the whole cache every step."""
    cache = torch.zeros(PIECES, ROW_FLOATS)
    with replay.recording(tmp_path / "snap", asynchronous=False):
        for step in range(4):
            write_row(cache, torch.full((ROW_FLOATS,), float(step + 1)), step)
            row_sums(cache)
    described = descriptions(tmp_path / "snap")
    reads, writes = described[1::2], described[0::2]
    assert all("chunks" in read["in/cache"] and "blob" not in read["in/cache"] for read in reads)
    # one whole list for the writes' cache and one for the reads'; every later read, edits of it
    assert len({d["chunks"] for d in [*(w["out/cache"] for w in writes), *(r["in/cache"] for r in reads)]}) == 2
    assert all("chunk_edits" in read["in/cache"] for read in reads[1:])
    calls = list(Snapshot(tmp_path / "snap"))
    assert torch.equal(calls[-1].tensors["in/cache"], cache)


def test_a_new_row_and_the_cache_piece_it_becomes_are_stored_once(tmp_path: Path) -> None:
    steps = 8
    decode(tmp_path / "snap", steps)
    described = descriptions(tmp_path / "snap")
    assert all("chunks" in d["in/row"] and "blob" not in d["in/row"] for d in described)
    packs = sorted((tmp_path / "snap" / "packs").iterdir())
    stored = sum(pack.stat().st_size for pack in packs)
    # the cache of zeros (one piece) and each step's row, which is also the cache's new piece
    assert (steps + 1) * CHUNK_BYTES <= stored < (steps + 1) * (CHUNK_BYTES + 512)
    blobs = tmp_path / "snap" / "blobs"
    assert all(blob.stat().st_size < CHUNK_BYTES for blob in blobs.iterdir())  # lists and edits only


@replay.capture("edits_scale")
def scale(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x * weight


@replay.capture("edits_add_into", mutates=("cache",))
def add_into(cache: torch.Tensor, delta: torch.Tensor) -> None:
    cache += delta


def test_only_a_call_writing_pieces_stores_its_small_read_only_inputs_in_pieces(tmp_path: Path) -> None:
    """Elsewhere a read-only input stays one blob (one file, where pieces and their list are two)."""
    from replay.snapshot.writer import PIECED_READ_ONLY_BYTES

    small, large = torch.rand(CHUNK_BYTES // 4), torch.rand(PIECED_READ_ONLY_BYTES // 4)
    cache = torch.zeros(PIECED_READ_ONLY_BYTES // 4)
    with replay.recording(tmp_path / "snap", asynchronous=False):
        scale(small, small)
        add_into(cache, large)
    first, second = descriptions(tmp_path / "snap")
    assert "blob" in first["in/weight"] and "blob" in second["in/delta"] and "chunks" in second["out/cache"]
    calls = list(Snapshot(tmp_path / "snap"))
    assert torch.equal(calls[0].tensors["in/weight"], small) and torch.equal(calls[1].tensors["in/delta"], large)


def test_stores_of_two_lengths_in_one_lineage_each_edit_their_own_list(tmp_path: Path) -> None:
    """An output buffer and its mask of unchanged elements share an op and a name: alternating,
    neither may push the other's base out (every store would then be a whole list)."""
    from replay.snapshot import SnapshotWriter
    from replay.snapshot.writer import cut_bytes

    writer = SnapshotWriter(tmp_path / "snap")
    buffer, mask = np.zeros(8 * CHUNK_BYTES, dtype=np.uint8), np.zeros(2 * CHUNK_BYTES, dtype=np.uint8)
    named = []
    for step in range(3):
        buffer[step * CHUNK_BYTES] = mask[step % 2 * CHUNK_BYTES] = step + 1
        named += [writer.put_pieces(cut_bytes(data.copy()), lineage=("op", "x"))[0] for data in (buffer, mask)]
    writer.close()
    assert [listed.edits is None for listed in named] == [True, True, False, False, False, False]
    assert named[2].whole == named[4].whole == named[0].whole and named[3].whole == named[5].whole == named[1].whole


def edited(rows: np.ndarray, changes: dict[int, bytes]) -> np.ndarray:
    out = rows.copy()
    for number, row in changes.items():
        out[number] = np.frombuffer(row, dtype=np.uint8)
    return out


@settings(max_examples=60, deadline=None)
@given(pieces=st.integers(1, 300), data=st.data())
def test_edits_between_two_lists_take_one_to_the_other(pieces: int, data: st.DataObject) -> None:
    rng = np.random.default_rng(pieces)
    base = rng.integers(0, 256, size=(pieces, chunk_lists.ROW), dtype=np.uint8)
    numbers = data.draw(st.sets(st.integers(0, pieces - 1), max_size=min(pieces, 40)))
    rows = edited(base, {n: bytes(rng.integers(0, 256, chunk_lists.ROW, dtype=np.uint8)) for n in numbers})
    changed = int((rows != base).any(axis=1).sum())
    edits = chunk_lists.edits_between(base, rows)
    if changed > chunk_lists.most_edits(pieces):
        assert edits is None
        return
    assert edits is not None and len(edits) == changed
    if changed:
        assert chunk_lists.apply_edits(base.tobytes(), edits) == rows.tobytes()


@settings(max_examples=25, deadline=None)
@given(pieces=st.integers(2, 40), data=st.data())
def test_a_list_patched_from_the_store_before_is_the_list_made_whole(tmp_path_factory: pytest.TempPathFactory,
                                                                     pieces: int, data: st.DataObject) -> None:
    # two memories of one lineage (two layers' caches), stored in turns: one writer told each store's
    # fresh places and the store before's list, one told nothing, write the same lists
    folder = tmp_path_factory.mktemp("lists")
    told, untold = SnapshotWriter(folder / "told"), SnapshotWriter(folder / "untold")
    values = {m: [0] * pieces for m in (0, 1)}
    before: dict[int, tuple[list[str], chunk_lists.ChunkList]] = {}
    for _ in range(data.draw(st.integers(1, 7))):
        memory = data.draw(st.sampled_from((0, 1)))
        fresh = sorted(data.draw(st.sets(st.integers(0, pieces - 1), max_size=pieces)))
        for n in fresh:  # a fresh place may hold what it held: the device's flags are never fewer
            values[memory][n] = data.draw(st.integers(0, 3))
        cut = [np.full(CHUNK_BYTES, value, dtype=np.uint8) for value in values[memory]]
        known = None
        if memory in before:
            digests, listed = before[memory]
            known = hashing.Known([None if n in fresh else d for n, d in enumerate(digests)], fresh, fresh, listed)
        listed, digests = told.put_pieces(cut, known, ("op", "cache"))
        whole, whole_digests = untold.put_pieces(cut, None, ("op", "cache"))
        assert digests == whole_digests and listed == whole
        assert listed.rows is not None and whole.rows is not None and np.array_equal(listed.rows, whole.rows)
        before[memory] = (digests, listed)


def test_another_length_is_a_whole_list() -> None:
    base = np.zeros((8, chunk_lists.ROW), dtype=np.uint8)
    assert chunk_lists.edits_between(base, np.zeros((9, chunk_lists.ROW), dtype=np.uint8)) is None


@pytest.mark.parametrize("edits, says", [
    (np.zeros((1, 36), dtype=np.uint8), "is not a [edits, 40] table"),
    (np.zeros((0, 40), dtype=np.uint8), "is not a [edits, 40] table"),
    (np.zeros((1, 40), dtype=np.int16), "is not a [edits, 40] table"),
    (np.array([[9, 0, 0, 0] + [0] * 36], dtype=np.uint8), "of a list of 4 in increasing order"),
    (np.array([[2, 0, 0, 0] + [0] * 36, [1, 0, 0, 0] + [0] * 36], dtype=np.uint8), "in increasing order"),
    (np.array([[1, 0, 0, 0] + [0] * 36, [1, 0, 0, 0] + [0] * 36], dtype=np.uint8), "in increasing order"),
])
def test_edits_that_do_not_edit_the_list_are_refused(edits: np.ndarray, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        chunk_lists.apply_edits(bytes(4 * chunk_lists.ROW), edits)


def written_with_edits(path: Path, edits: np.ndarray | None, *, version: int | None = None) -> Path:
    """A snapshot of one call whose 4-piece input names a whole list and the edit list `edits`
    (None: an edit list that changes its second piece), written by hand."""
    from replay.snapshot import SnapshotWriter
    from replay.snapshot.chunk_lists import ChunkList
    from replay.snapshot.tensors import Geometry

    writer = SnapshotWriter(path)
    span = torch.arange(4 * CHUNK_BYTES, dtype=torch.uint8)
    listed, _ = writer.put_chunks(span)
    if edits is None:  # piece 1 as piece 0 is: the list's row 0 in row 1's place
        edits = np.zeros((1, chunk_lists.EDIT_ROW), dtype=np.uint8)
        edits[0, :4] = np.array([1], dtype="<u4").view(np.uint8)
        rows = np.frombuffer((path / "blobs" / f"{listed.whole}.safetensors").read_bytes()[-4 * chunk_lists.ROW:],
                             dtype=np.uint8).reshape(4, chunk_lists.ROW)
        edits[0, 4:] = rows[0]
    named = ChunkList(listed.whole, edits)
    geometry = Geometry("uint8", (4 * CHUNK_BYTES,), (1,), 0)
    writer.write_call(writer.reserve_index(), {"op": "x", "variant": "v", "provider": None, "returns_json": {},
                                               "args": [{"name": "x", "tensor": "in/x"}], "launch": [], "meta": {}},
                      {}, {"in/x": geometry}, {}, {"in/x": named})
    writer.close()
    if version is not None:
        rewrite = path / "manifest.json"
        rewrite.write_text(json.dumps(dict(json.loads(rewrite.read_text()), format_version=version)))
    return path


def test_a_list_with_its_edits_reads_back_edited(tmp_path: Path) -> None:
    call = Snapshot(written_with_edits(tmp_path / "snap", None)).load(0)
    expected = torch.arange(4 * CHUNK_BYTES, dtype=torch.uint8)
    expected[CHUNK_BYTES:2 * CHUNK_BYTES] = expected[:CHUNK_BYTES]
    assert torch.equal(call.tensors["in/x"], expected)


def test_edits_in_a_snapshot_older_than_version_6_are_refused(tmp_path: Path) -> None:
    snap = written_with_edits(tmp_path / "snap", None, version=5)
    with pytest.raises(SnapshotError, match=r"tensor 'in/x': its chunk list is edited .* format version 5 has not"):
        Snapshot(snap).load(0)


def test_edits_of_another_list_are_named_with_the_tensor(tmp_path: Path) -> None:
    stray = np.zeros((1, chunk_lists.EDIT_ROW), dtype=np.uint8)
    stray[0, :4] = np.array([9], dtype="<u4").view(np.uint8)  # piece 9 of a 4-piece list
    snap = written_with_edits(tmp_path / "snap", stray)
    with pytest.raises(SnapshotError, match=r"tensor 'in/x': its chunk edit list does not name pieces of a list of 4"):
        Snapshot(snap).load(0)
    wide = written_with_edits(tmp_path / "wide", np.zeros((1, 44), dtype=np.uint8))
    with pytest.raises(SnapshotError, match=r"its chunk edit list is not a \[edits, 40\] table"):
        Snapshot(wide).load(0)
