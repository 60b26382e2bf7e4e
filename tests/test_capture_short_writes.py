"""Nothing lost to a disk that fills: an index append the kernel cuts short is carried on, or cut
back to its last whole line with capture stopped and said; capture errors the manifest cannot take
at once reach it when the recording closes, or stderr says they could not."""
from __future__ import annotations

import errno
import json
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import torch

import replay
from replay.snapshot import Snapshot

CALLS = 8


@replay.capture("short_double")
def double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def index_appends(monkeypatch: pytest.MonkeyPatch, plan: Iterator[str]) -> None:
    """The kernel's answer to each index append, in turn: 'whole'; 'cut' (a third written, the rest
    on retry); 'full' (a third written, then no room: ENOSPC)."""
    real = os.write
    no_room = []

    def write(fd: int, data: bytes) -> int:
        data = bytes(data)
        if no_room:
            no_room.clear()
            raise OSError(errno.ENOSPC, "No space left on device")
        if data.startswith(b'{"index"'):
            behaviour = next(plan, "whole")
            if behaviour in ("cut", "full"):
                if behaviour == "full":
                    no_room.append(True)
                return real(fd, data[:len(data) // 3])
        return real(fd, data)
    monkeypatch.setattr(os, "write", write)


def record(path: Path, asynchronous: bool) -> replay.recorder.Recording:
    with replay.recording(path, asynchronous=asynchronous) as rec:
        for step in range(CALLS):
            double(torch.full((4, 4), float(step)))
    return rec


@pytest.mark.parametrize("asynchronous", [True, False])
def test_a_short_append_is_carried_on_and_the_index_stays_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                asynchronous: bool) -> None:
    index_appends(monkeypatch, iter(["whole", "cut", "whole", "cut", "cut"]))
    rec = record(tmp_path / "snap", asynchronous)
    read = Snapshot(tmp_path / "snap")
    assert rec.calls_written == len(read) == CALLS and not read.problems
    assert [float(r.tensors["in/x"][0, 0]) for r in read] == [float(step) for step in range(CALLS)]


@pytest.mark.parametrize("asynchronous", [True, False])
def test_a_disk_full_mid_append_keeps_every_whole_line_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   said,
                                                                   asynchronous: bool) -> None:
    index_appends(monkeypatch, iter(["whole", "whole", "whole", "full"]))
    rec = record(tmp_path / "snap", asynchronous)
    read = Snapshot(tmp_path / "snap")  # strict: a cut line would be an error here
    assert rec.calls_written == len(read) == 3
    assert [float(r.tensors["in/x"][0, 0]) for r in read] == [0.0, 1.0, 2.0]
    errors = json.loads((tmp_path / "snap" / "manifest.json").read_text())["capture_errors"]
    assert len(errors) == 1 and "writing call 3 failed" in errors[0] and "No space left" in errors[0]
    assert said() == [f"replay: capture: {errors[0]}"]


def test_an_error_the_manifest_cannot_take_at_once_reaches_it_at_close(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from replay.snapshot import writer
    real, refusals = writer.write_atomic, iter([True])

    def write_atomic(path: Path, data, **kwargs) -> None:
        if path.name == "manifest.json" and next(refusals, False):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data, **kwargs)
    monkeypatch.setattr(writer, "write_atomic", write_atomic)
    with replay.recording(tmp_path / "snap", queue_depth=1, when_full="drop") as rec:
        rec.report("a capture error met on a full disk", stop=False)
    assert json.loads((tmp_path / "snap" / "manifest.json").read_text())["capture_errors"] == [
        "a capture error met on a full disk"]


def test_a_manifest_that_stays_unwritable_is_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  said) -> None:
    from replay.snapshot import writer
    real = writer.write_atomic
    full = []

    def write_atomic(path: Path, data, **kwargs) -> None:
        if path.name == "manifest.json" and full:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data, **kwargs)
    monkeypatch.setattr(writer, "write_atomic", write_atomic)
    with replay.recording(tmp_path / "snap") as rec:
        full.append(True)
        rec.report("a capture error met on a full disk", stop=False)
    err = said()
    assert err[0] == "replay: capture: a capture error met on a full disk"
    assert err[1].startswith(f"replay: capture: {tmp_path / 'snap' / 'manifest.json'} could not be written")
    assert err[1].endswith("its capture_errors lack what is said above")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, where the machine lets this process mount one (root in a container that may)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def fill(disk: Path, n: list[int]) -> None:
    """Take every free byte of `disk` in a new file: the next write needing a page finds none."""
    stats = os.statvfs(disk)
    n[0] += 1
    with open(disk / f"filler-{n[0]}", "wb") as f:
        free = stats.f_bavail * stats.f_frsize
        if free:
            os.posix_fallocate(f.fileno(), 0, free)


def test_a_real_disk_full_to_its_last_page_loses_no_indexed_call(small_disk: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills up just after each call's file is written, so an index append that needs a new
    page finds none: the kernel writes what fits in the index's last page and says how much."""
    from replay.snapshot import writer
    real, fillers = writer.SnapshotWriter.write_segment, [0]

    def then_fill(self, parts):
        lines = real(self, parts)
        if parts[0].index > 0:  # the index's first page is taken by the first call
            fill(small_disk, fillers)
        return lines
    monkeypatch.setattr(writer.SnapshotWriter, "write_segment", then_fill)
    with replay.recording(small_disk / "snap", asynchronous=False) as rec:
        for step in range(200):
            double(torch.full((4, 4), float(step)))
            for filler in small_disk.glob("filler-*"):  # room for the next call's file
                filler.unlink()
    assert rec.stopped and 0 < rec.calls_written < 200
    read = Snapshot(small_disk / "snap")  # strict: a cut or glued index line would be an error here
    assert len(read) == rec.calls_written
    assert [float(r.tensors["in/x"][0, 0]) for r in read] == [float(step) for step in range(len(read))]
