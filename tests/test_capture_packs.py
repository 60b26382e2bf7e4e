"""Format 3: the new 64 KiB pieces of a chunked tensor go into one pack file, not a file each
(creating a file costs ~0.3 ms on the H100 machines whatever its size: docs/PERFORMANCE.md).
A pack's pieces are checked against their names when read; a damaged pack is one line naming it."""
from __future__ import annotations

import errno
import json
import threading
from pathlib import Path

import pytest
import torch

import replay
from replay.errors import SnapshotError
from replay.snapshot import Snapshot, writer

MiB = 1 << 20


@replay.capture("pack_scale", mutates=("state",))
def scale_(state: torch.Tensor, factor: float) -> None:
    state.mul_(factor)


def recorded(path: Path, steps: int = 2) -> tuple[Path, list[torch.Tensor]]:
    """A 4 MiB state (64 pieces) scaled in place `steps` times; its value before each call."""
    state = torch.arange(MiB, dtype=torch.float32)
    seen = []
    with replay.recording(path, asynchronous=False):  # one writer: which call packs a piece first is fixed
        for _ in range(steps):
            seen.append(state.clone())
            scale_(state, 2.0)
    seen.append(state.clone())
    return path, seen


def packs(path: Path) -> list[Path]:
    return sorted((path / "packs").iterdir())


def test_a_tensors_new_pieces_are_one_file_and_read_back_exactly(tmp_path: Path) -> None:
    snap, seen = recorded(tmp_path / "snap")
    # the first call's state before and after: a pack each; the second's before is the first's after
    assert len(packs(snap)) == 3
    assert len(list((snap / "blobs").iterdir())) == 3  # the three distinct chunk lists, nothing else
    calls = list(Snapshot(snap))
    for call, before, after in zip(calls, seen, seen[1:]):
        assert torch.equal(call.tensors["in/state"], before) and torch.equal(call.tensors["out/state"], after)
    assert json.loads((snap / "manifest.json").read_text())["format_version"] == 6


def test_pieces_another_call_stored_are_not_packed_again(tmp_path: Path) -> None:
    # a multiply by one leaves the state as it was: the second call's pieces are all known
    state = torch.arange(MiB, dtype=torch.float32)
    with replay.recording(tmp_path / "snap", asynchronous=False):
        scale_(state, 1.0)
        scale_(state, 1.0)
    assert len(packs(tmp_path / "snap")) == 1
    first, second = Snapshot(tmp_path / "snap")
    assert torch.equal(second.tensors["out/state"], state) and torch.equal(first.tensors["in/state"], state)


def pack_writes_held(monkeypatch: pytest.MonkeyPatch, fail: bool = False) -> tuple[threading.Event, threading.Event]:
    """Writing a pack waits for the second event once it has set the first (then fails, with `fail`)."""
    started, release = threading.Event(), threading.Event()
    real = writer.write_atomic

    def held(path: Path, data: object, **options: object) -> None:
        if path.parent.name == "packs":
            started.set()
            release.wait(30)
            if fail:
                raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data, **options)
    monkeypatch.setattr(writer, "write_atomic", held)
    return started, release


@pytest.mark.parametrize("fail", [False, True], ids=["written", "failed"])
def test_pieces_another_thread_is_packing_are_waited_for_not_packed_twice(tmp_path: Path, fail: bool,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # one call's output is the next one's input: two writer threads may chunk the same bytes at once
    snap = writer.SnapshotWriter(tmp_path / "snap")
    span = torch.arange(MiB // 4, dtype=torch.float32)  # 16 pieces
    started, release = pack_writes_held(monkeypatch, fail)
    outcomes: dict[str, object] = {}

    def put(who: str) -> None:
        try:
            outcomes[who] = snap.put_chunks(span.clone())
        except OSError as exc:
            outcomes[who] = exc
    first = threading.Thread(target=put, args=("first",))
    first.start()
    assert started.wait(30)
    second = threading.Thread(target=put, args=("second",))
    second.start()
    second.join(0.3)
    assert second.is_alive()  # the pieces are the first's pack's, which is not whole yet: it waits
    release.set()
    first.join()
    second.join()
    if fail:
        assert all(isinstance(outcome, OSError) for outcome in outcomes.values())
        monkeypatch.undo()  # the disk writes again: the same bytes are packed anew, not named from the lost pack
        snap.put_chunks(span.clone())
        assert len(packs(tmp_path / "snap")) == 1
    else:
        assert outcomes["first"] == outcomes["second"] and len(packs(tmp_path / "snap")) == 1


def flip_a_byte(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_tampered_piece_is_named_by_its_pack(tmp_path: Path) -> None:
    snap, _ = recorded(tmp_path / "snap", steps=1)
    pack = packs(snap)[0]
    flip_a_byte(pack, pack.stat().st_size - 10)  # inside the last piece's bytes
    with pytest.raises(SnapshotError, match=rf"{pack.name}: chunk [0-9a-f]{{12}}: sha256 mismatch"):
        Snapshot(snap).load(0)


def test_a_truncated_pack_is_named(tmp_path: Path) -> None:
    snap, _ = recorded(tmp_path / "snap", steps=1)
    pack = packs(snap)[0]
    pack.write_bytes(pack.read_bytes()[:-100])
    with pytest.raises(SnapshotError, match=rf"{pack.name}: pack entry .* lying inside the file"):
        Snapshot(snap).load(0)
    pack.write_bytes(b"\x10\x00")
    with pytest.raises(SnapshotError, match=rf"{pack.name}: not a pack: its header is cut short"):
        Snapshot(snap).load(0)


def write_pack(path: Path, header: bytes, payload: bytes) -> None:
    path.write_bytes(len(header).to_bytes(8, "little") + header + payload)


def test_a_missing_or_hostile_pack_is_one_line(tmp_path: Path) -> None:
    snap, _ = recorded(tmp_path / "snap", steps=1)
    first = packs(snap)[0]
    name = "ab" * 32
    write_pack(first, f'{{"{name}":{{"dtype":"U8","shape":[8],"data_offsets":[0,9]}}}}'.encode(), bytes(9))
    with pytest.raises(SnapshotError, match="is not a run of bytes named by its sha256"):
        Snapshot(snap).load(0)
    write_pack(first, f'{{"{name}":{{"dtype":"U8","shape":[9],"data_offsets":[0,9]}}}}'.encode(), bytes(9))
    with pytest.raises(SnapshotError, match=rf"{first.name}: holds no chunk [0-9a-f]{{12}}"):
        Snapshot(snap).load(0)
    first.unlink()
    with pytest.raises(SnapshotError, match=rf"{first.name}: missing pack named by a chunk list"):
        Snapshot(snap).load(0)


def test_a_pack_whose_entries_overlap_or_are_not_objects_is_refused(tmp_path: Path) -> None:
    # overlapping entries, each named rightly, would read a small pack as many times its size
    snap, _ = recorded(tmp_path / "snap", steps=1)
    first = packs(snap)[0]
    a, b = "ab" * 32, "cd" * 32
    write_pack(first, f'{{"{a}":{{"dtype":"U8","shape":[8],"data_offsets":[0,8]}},'
                      f'"{b}":{{"dtype":"U8","shape":[8],"data_offsets":[4,12]}}}}'.encode(), bytes(16))
    with pytest.raises(SnapshotError, match=rf"{first.name}: pack entries overlap"):
        Snapshot(snap).load(0)
    write_pack(first, f'{{"{a}": 5}}'.encode(), bytes(8))
    with pytest.raises(SnapshotError, match="is not a run of bytes named by its sha256"):
        Snapshot(snap).load(0)


def test_a_packed_chunk_list_in_a_version_2_snapshot_is_refused(tmp_path: Path) -> None:
    snap, _ = recorded(tmp_path / "snap", steps=1)
    manifest = json.loads((snap / "manifest.json").read_text())
    (snap / "manifest.json").write_text(json.dumps(dict(manifest, format_version=2)))
    with pytest.raises(SnapshotError, match="its chunk list names packs, which format version 2 has not"):
        Snapshot(snap).load(0)
