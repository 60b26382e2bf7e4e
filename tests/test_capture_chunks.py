"""Large tensors that calls write (a KV cache) are stored as content-addressed 64 KiB chunks
(snapshot format 2): they read back exactly, and a decode loop costs the pages it changed."""
from __future__ import annotations

import json
from pathlib import Path

import torch

import replay
from replay.snapshot import Snapshot

MiB = 1 << 20


@replay.capture("chunk_write", mutates=("cache",))
def write_position(cache: torch.Tensor, row: torch.Tensor, position: int) -> None:
    cache[position] = row


@replay.capture("chunk_scale")
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


def version(path: Path) -> int:
    return json.loads((path / "manifest.json").read_text())["format_version"]


def test_chunked_tensors_read_back_exactly_and_make_the_snapshot_format_2(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    base = torch.randn(3, 1400, 301, generator=gen).to(torch.bfloat16)  # 2.5 MB, not a multiple of 64 KiB
    view = base[1:, :, 7:].transpose(0, 1)  # a strided view with a storage offset
    flags = torch.rand(1 << 21, generator=gen) > 0.5  # 2 MiB of bools
    with replay.recording(tmp_path / "snap"):
        scaled = scale(view, 2.0)
        write_position(base[0], base[2, 0], 5)
        out_flags = scale(flags, 1)
    records = list(Snapshot(tmp_path / "snap"))
    assert version(tmp_path / "snap") == 2
    x = records[0].tensors["in/x"]
    assert (x.shape, x.stride(), x.storage_offset(), x.dtype) == (view.shape, view.stride(), view.storage_offset(),
                                                                   torch.bfloat16)
    assert torch.equal(x, view) and torch.equal(records[0].tensors["out/out"], scaled)
    assert torch.equal(records[1].tensors["out/cache"], base[0])
    assert torch.equal(records[2].tensors["in/x"], flags) and torch.equal(records[2].tensors["out/out"], out_flags)
    index = [json.loads(line) for line in (tmp_path / "snap" / "calls.jsonl").read_text().splitlines()]
    assert [len(line["blobs"]) for line in index] == [2, 0, 2]  # each call names its chunk lists


def test_a_snapshot_without_large_tensors_stays_format_1(tmp_path: Path) -> None:
    with replay.recording(tmp_path / "snap"):
        scale(torch.ones(1000), 2.0)
    assert version(tmp_path / "snap") == 1 and len(Snapshot(tmp_path / "snap")) == 1


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
