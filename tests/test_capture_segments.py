"""Format 4: a recording writes many calls to a file (a segment), closed by size or age, each
call indexed only once its segment is whole on disk; a damaged segment is one line naming it."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

import replay
from replay.cli import main as cli_main
from replay.errors import SnapshotError
from replay.snapshot import Snapshot
from click.testing import CliRunner


@replay.capture("segment_scale")
def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


def strided_inputs(calls: int) -> list[torch.Tensor]:
    """Views with strides and storage offsets, a transposed one, a zero-size one, a bool one."""
    gen = torch.Generator().manual_seed(0)
    views = []
    for n in range(calls):
        base = torch.randn(6, 10, generator=gen)
        views.append([base[1:5, ::3], base.t()[2:], base[:0], base > 0][n % 4])
    return views


def segments(path: Path) -> list[Path]:
    return sorted((path / "segments").iterdir())


def test_many_calls_share_a_segment_and_read_back_with_their_geometry(tmp_path: Path) -> None:
    inputs = strided_inputs(12)
    with replay.recording(tmp_path / "snap"):
        outputs = [scale(x, 1.5) if x.dtype != torch.bool else scale(x, True) for x in inputs]
    read = Snapshot(tmp_path / "snap")
    assert len(segments(tmp_path / "snap")) == 1 and len(read) == 12
    for record, x, out in zip(read, inputs, outputs):
        stored = record.tensors["in/x"]
        assert (stored.shape, stored.stride(), stored.storage_offset(), stored.dtype) == \
            (x.shape, x.stride(), x.storage_offset(), x.dtype)
        assert torch.equal(stored, x) and torch.equal(record.tensors["out/out"], out)
    entries = [json.loads(line) for line in (tmp_path / "snap" / "calls.jsonl").read_text().splitlines()]
    assert [e["call"] for e in entries] == [f"c{i:06d}/" for i in range(12)]
    assert len({(e["file"], e["sha256"], e["bytes"]) for e in entries}) == 1


def test_a_call_changed_by_its_reader_does_not_change_the_next_reading(tmp_path: Path) -> None:
    with replay.recording(tmp_path / "snap"):
        scale(torch.ones(4), 2.0)
    read = Snapshot(tmp_path / "snap")
    read.load(0).tensors["in/x"].fill_(7.0)
    assert torch.equal(read.load(0).tensors["in/x"], torch.ones(4))


def test_a_segment_closes_at_its_size(tmp_path: Path) -> None:
    with replay.recording(tmp_path / "snap", segment_bytes=3000):
        for _ in range(10):
            scale(torch.zeros(256), 2.0)  # 2 KiB a call (1 KiB in, 1 KiB out) and its description
    assert len(segments(tmp_path / "snap")) == 5  # two calls a segment: the second crosses the size
    assert len(Snapshot(tmp_path / "snap")) == 10


def test_a_segment_closes_at_its_age_while_the_program_goes_on(tmp_path: Path) -> None:
    with replay.recording(tmp_path / "snap", segment_seconds=0.05) as rec:
        scale(torch.zeros(4), 2.0)
        deadline = time.monotonic() + 30
        while rec.calls_written == 0 and time.monotonic() < deadline:  # no flush: the writers' clock
            time.sleep(0.01)
        assert len(Snapshot(tmp_path / "snap")) == 1
        scale(torch.zeros(4), 3.0)
    assert len(segments(tmp_path / "snap")) == 2


def test_synchronous_recording_writes_a_segment_a_call(tmp_path: Path) -> None:
    with replay.recording(tmp_path / "snap", asynchronous=False) as rec:
        for n in range(3):
            scale(torch.zeros(4), float(n))
            assert rec.calls_written == n + 1  # on disk before the program goes on
    assert len(segments(tmp_path / "snap")) == 3


@pytest.mark.parametrize("option, value", [("segment_bytes", -1), ("segment_seconds", 0), ("segment_seconds", "1")])
def test_bad_segment_options_are_clear_errors(option: str, value: object, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"{option}="):
        with replay.recording(tmp_path / "snap", **{option: value}):
            pass


def damaged(tmp_path: Path, damage) -> Path:
    with replay.recording(tmp_path / "snap"):
        for n in range(3):
            scale(torch.full((64,), float(n)), 2.0)
    (segment,) = segments(tmp_path / "snap")
    damage(segment)
    return segment


@pytest.mark.parametrize("damage, says", [
    (lambda p: p.write_bytes(p.read_bytes()[:-40]), "the index says"),
    (lambda p: p.write_bytes(p.read_bytes()[:-4] + b"\xff\xff\xff\xff"), "sha256 mismatch"),
], ids=["truncated", "tampered"])
def test_a_damaged_segment_is_one_line_naming_it_and_exit_2(tmp_path: Path, damage, says: str) -> None:
    segment = damaged(tmp_path, damage)
    with pytest.raises(SnapshotError, match=says):
        Snapshot(tmp_path / "snap").load(0)
    result = CliRunner().invoke(cli_main, ["run", str(tmp_path / "snap")])
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and str(segment) in lines[0] and says in lines[0], result.stderr
