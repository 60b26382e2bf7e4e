"""Large tensors that calls write (a KV cache) are stored as content-addressed 64 KiB chunks, the
new ones of a tensor packed into one file (snapshot format 3): they read back exactly, and a
decode loop costs the pages it changed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import replay
from replay.snapshot import Snapshot

MiB = 1 << 20


@replay.capture("chunk_write", mutates=("cache",))
def write_position(cache: torch.Tensor, row: torch.Tensor, position: int) -> None:
    cache[position] = row


@replay.capture("chunk_update", mutates=("state",))
def update(state: torch.Tensor, factor: float) -> torch.Tensor:
    state.mul_(factor)
    return state.float().sum()


@replay.capture("chunk_flip", mutates=("flags",))
def flip(flags: torch.Tensor) -> None:
    flags.logical_not_()


@replay.capture("chunk_scale")
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


def version(path: Path) -> int:
    return json.loads((path / "manifest.json").read_text())["format_version"]


def test_written_state_reads_back_exactly_from_chunks_in_packs(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(3, 1400, 301, generator=gen).to(torch.bfloat16)  # 2.5 MB, not a multiple of 64 KiB
    view = base[1:, :, 7:].transpose(0, 1)  # a strided view with a storage offset
    flags = torch.rand(1 << 21, generator=gen) > 0.5  # 2 MiB of bools
    view_before, flags_before = view.clone(), flags.clone()
    with replay.recording(tmp_path / "snap"):
        total = update(view, 2.0)
        flip(flags)
    first, second = Snapshot(tmp_path / "snap")
    assert version(tmp_path / "snap") == 6 and len(list((tmp_path / "snap" / "packs").iterdir())) == 4
    before, after = first.tensors["in/state"], first.tensors["out/state"]
    assert (before.shape, before.stride(), before.storage_offset(), before.dtype) == \
        (view.shape, view.stride(), view.storage_offset(), torch.bfloat16)
    assert torch.equal(before, view_before) and torch.equal(after, view) and torch.equal(first.tensors["out/out"], total)
    assert torch.equal(second.tensors["in/flags"], flags_before) and torch.equal(second.tensors["out/flags"], flags)
    index = [json.loads(line) for line in (tmp_path / "snap" / "calls.jsonl").read_text().splitlines()]
    assert [len(line["blobs"]) for line in index] == [2, 2]  # each call names its two chunk lists


def test_fresh_outputs_stay_inline_and_need_no_packs(tmp_path: Path) -> None:
    x = torch.randn(1 << 20)  # 4 MiB: read-only, so one blob; its product is a fresh output, inline
    with replay.recording(tmp_path / "snap"):
        out = scale(x, 2.0)
    (record,) = Snapshot(tmp_path / "snap")
    assert not (tmp_path / "snap" / "packs").exists() and torch.equal(record.tensors["out/out"], out)
    assert list(record.blobs) == ["in/x"]


def test_a_decode_loop_over_a_64_mib_cache_writes_the_pages_it_changed(tmp_path: Path) -> None:
    # [positions, everything a position holds]: each decode step writes one 64 KiB position
    cache = torch.zeros(1024, 16384)
    rows = [torch.full((16384,), float(step + 1)) for step in range(32)]
    with replay.recording(tmp_path / "snap"):
        for step, row in enumerate(rows):
            write_position(cache, row, step)
    changed = sum(row.numel() * row.element_size() for row in rows)  # 2 MiB
    activations = changed  # each call's row, stored in its call file
    written = sum(f.stat().st_size for f in (tmp_path / "snap").rglob("*") if f.is_file())
    assert written < 2 * changed + activations, f"{written / MiB:.2f} MiB written"
    snapshot = Snapshot(tmp_path / "snap")
    tenth = snapshot.load(snapshot.entries[10])
    assert tenth.tensors["in/cache"][:10].eq(torch.arange(1, 11).unsqueeze(1)).all()
    assert not tenth.tensors["in/cache"][10:].any() and torch.equal(tenth.tensors["out/cache"][10], rows[10])
    last = snapshot.load(snapshot.entries[-1])
    assert torch.equal(last.tensors["out/cache"], cache)


def hostile_chunked_call(path: Path, pieces: int, piece_bytes: int) -> Path:
    """A snapshot whose one call lists the same piece `pieces` times."""
    from replay.snapshot import SnapshotWriter
    from replay.snapshot.chunk_lists import ChunkList
    from replay.snapshot.tensors import Geometry

    writer = SnapshotWriter(path)
    piece = writer.put_blob(torch.zeros(piece_bytes, dtype=torch.uint8))
    table = torch.tensor(list(bytes.fromhex(piece)) * pieces, dtype=torch.uint8).view(pieces, 32)
    listed = writer.put_blob(table)
    numel = pieces * piece_bytes
    writer.write_call(writer.reserve_index(), {"op": "x", "variant": "v", "provider": None,
                                               "args": [{"name": "x", "tensor": "in/x"}], "returns_json": {},
                                               "launch": [], "meta": {}},
                      {}, {"in/x": Geometry("uint8", (numel,), (1,), 0)}, {}, {"in/x": ChunkList(listed)})
    writer.close()
    return path


def test_hostile_chunk_lists_are_one_line_errors(tmp_path: Path) -> None:
    from replay.errors import SnapshotError

    repeated = hostile_chunked_call(tmp_path / "repeated", 2048, 1 << 20)  # 1 MiB on disk reading as 2 GiB
    with pytest.raises(SnapshotError, match="its chunks join to 2147483648 bytes in memory, more than the 268435456"):
        Snapshot(repeated).load(0)
    # one 64 KiB piece listed 40 000 times: 1.3 MB on disk joining to 2.6 GB
    entries = hostile_chunked_call(tmp_path / "entries", 40_000, 64 << 10)
    with pytest.raises(SnapshotError, match="its chunks join to 2621440000 bytes in memory"):
        Snapshot(entries).load(0)
    # 100 entries join to 6.4 MB: within the floor by default, past 64 times the stored bytes below it
    small = hostile_chunked_call(tmp_path / "small", 100, 64 << 10)
    assert Snapshot(small).load(0).tensors["in/x"].numel() == 100 << 16
    with pytest.raises(SnapshotError, match="more than the 4.* its 6.* distinct stored bytes allow"):
        Snapshot(small, read_limit=1 << 20).load(0)
    empty = hostile_chunked_call(tmp_path / "empty", 0, 16)
    with pytest.raises(SnapshotError, match=r"its chunk list is not a \[pieces, 32\] table"):
        Snapshot(empty).load(0)


def test_a_large_blob_hashed_while_written_is_the_same_blob(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A blob over the threshold is hashed on a thread of its own as it is written: same name,
    same bytes as one hashed first; stored once however often it is put; no temporary left."""
    from replay.snapshot import SnapshotWriter, writer as snapshot_writer

    data = torch.arange(4096, dtype=torch.float32)
    small_first = SnapshotWriter(tmp_path / "a")
    expected = small_first.put_blob(data)
    monkeypatch.setattr(snapshot_writer, "HASH_WHILE_WRITING_BYTES", 1024)
    large = SnapshotWriter(tmp_path / "b")
    assert large.put_blob(data) == large.put_blob(data.clone()) == expected
    large.close()
    assert sorted(p.name for p in (tmp_path / "b" / "blobs").iterdir()) == [f"{expected}.safetensors"]
    assert (tmp_path / "b" / "blobs" / f"{expected}.safetensors").read_bytes() == \
        (tmp_path / "a" / "blobs" / f"{expected}.safetensors").read_bytes()


def test_a_blob_named_by_many_tensors_counts_once_in_what_a_call_stores(tmp_path: Path) -> None:
    from replay.errors import SnapshotError
    from replay.snapshot import SnapshotWriter
    from replay.snapshot.tensors import Geometry

    writer = SnapshotWriter(tmp_path / "snap")
    blob = writer.put_blob(torch.zeros(64 << 10, dtype=torch.uint8))
    keys = [f"in/x{i}" for i in range(100)]  # 64 KiB on disk, copied 100 times: 6.4 MB in memory
    writer.write_call(writer.reserve_index(), {"op": "x", "variant": "v", "provider": None, "returns_json": {},
                                               "args": [{"name": k[3:], "tensor": k} for k in keys], "launch": [],
                                               "meta": {}},
                      {}, {k: Geometry("uint8", (64 << 10,), (1,), 0) for k in keys}, {k: blob for k in keys})
    writer.close()
    assert len(Snapshot(tmp_path / "snap").load(0).tensors) == 100
    with pytest.raises(SnapshotError, match="its copy of blob .* brings it to .* bytes in memory"):
        Snapshot(tmp_path / "snap", read_limit=1 << 20).load(0)
