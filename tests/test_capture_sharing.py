"""Capture under load: threads calling at once, weights shared by many calls, unsafe op names."""
from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest
import torch

import replay
from replay.errors import RegistryError
from replay.registry import capture
from replay.snapshot import Snapshot

THREADS, CALLS_PER_THREAD = 4, 40


@replay.capture("share_linear")
def linear(x: torch.Tensor, weight: torch.Tensor, call_id: int = 0) -> torch.Tensor:
    return x @ weight


def blob_count(snapshot: Path) -> int:
    return len(list((snapshot / "blobs").glob("*.safetensors")))


@pytest.fixture
def frequent_thread_switches() -> Iterator[None]:
    """Make the interpreter switch threads as often as it can, to expose races."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(previous)


def test_threads_recording_at_once_give_every_call_exactly_once(tmp_path: Path, frequent_thread_switches: None) -> None:
    weight = torch.randn(128, 128)  # 64 KiB: every thread stores it as the same blob
    start = threading.Barrier(THREADS)

    def worker(thread: int) -> None:
        start.wait()
        for n in range(CALLS_PER_THREAD):
            call_id = thread * CALLS_PER_THREAD + n
            linear(torch.full((2, 128), float(call_id)), weight, call_id=call_id)

    with replay.recording(tmp_path / "snap") as rec:
        workers = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    assert not rec.stopped
    snapshot = Snapshot(tmp_path / "snap")
    seen = []
    for record in snapshot:
        call_id = record.arguments()["call_id"]
        seen.append(call_id)
        assert torch.equal(record.tensors["in/x"], torch.full((2, 128), float(call_id)))
        assert torch.equal(record.tensors["out/out"], record.tensors["in/x"] @ weight)
    assert sorted(seen) == list(range(THREADS * CALLS_PER_THREAD))
    assert sorted(e.index for e in snapshot.entries) == list(range(THREADS * CALLS_PER_THREAD))
    assert blob_count(tmp_path / "snap") == 1


def test_a_weight_passed_to_every_layer_is_written_once(tmp_path: Path) -> None:
    weight = torch.randn(256, 256)  # 256 KiB
    x = torch.randn(1, 256)
    with replay.recording(tmp_path / "snap"):
        for _ in range(32):
            x = linear(x, weight).tanh()
            linear(x, weight.t())  # a transposed view reaches the same storage: same blob
        linear(x, weight.clone())  # equal content in another tensor: same blob
    assert blob_count(tmp_path / "snap") == 1
    on_disk = sum(f.stat().st_size for f in (tmp_path / "snap").rglob("*") if f.is_file())
    assert on_disk < 2 * weight.numel() * weight.element_size()  # 65 references, stored once

    snapshot = Snapshot(tmp_path / "snap")
    assert all(torch.equal(r.tensors["in/weight"].contiguous(), weight if r.index % 2 == 0 else weight.t())
               for r in snapshot if r.index < 64)


def test_a_weight_modified_in_place_gets_a_new_blob(tmp_path: Path) -> None:
    weight = torch.randn(256, 256)
    original = weight.clone()
    with replay.recording(tmp_path / "snap"):
        linear(torch.randn(1, 256), weight)
        weight.add_(1.0)
        linear(torch.randn(1, 256), weight)
    assert blob_count(tmp_path / "snap") == 2
    first, second = Snapshot(tmp_path / "snap")
    assert torch.equal(second.tensors["in/weight"], weight)
    assert torch.equal(first.tensors["in/weight"], original)


@replay.capture("share_kernel_write", mutates=("cache",))
def kernel_write(cache: torch.Tensor, step: int) -> None:
    cache.numpy()[step] = step + 1  # as a Triton kernel writes: the version counter does not move


@replay.capture("share_read")
def read(cache: torch.Tensor) -> torch.Tensor:
    return cache.sum()


def test_a_tensor_an_op_declares_it_mutates_is_stored_anew_after_each_call(tmp_path: Path) -> None:
    """A KV cache written by a kernel (no version bump) and read by the next op: each read
    records the cache as it is then, not the blob of an earlier read."""
    cache = torch.zeros(64, 1024)  # 256 KiB: a read-only input of the reader, stored as a blob
    with replay.recording(tmp_path / "snap"):
        for step in range(3):
            kernel_write(cache, step)
            read(cache)
    reads = [record for record in Snapshot(tmp_path / "snap") if record.op == "share_read"]
    assert [float(r.tensors["in/cache"].sum()) for r in reads] == [1024.0, 3072.0, 6144.0]
    assert [float(r.tensors["out/out"]) for r in reads] == [1024.0, 3072.0, 6144.0]


def test_unsafe_op_names_stay_inside_the_snapshot(tmp_path: Path) -> None:
    names = ["../../escape", "a/b\\c", "ctrl\x00\n\x1b[31m", "..", "/abs/path"]
    functions = [capture(name)(lambda x: x + 1) for name in names]
    with replay.recording(tmp_path / "snap"):
        for fn in functions:
            fn(torch.zeros(1))
    snapshot = Snapshot(tmp_path / "snap")
    assert [e.op for e in snapshot.entries] == names  # the names themselves are kept, as data
    root = (tmp_path / "snap").resolve()
    for entry in snapshot.entries:
        path = (root / entry.file).resolve()
        assert path.parent == root / "segments" and path.is_file()
        assert all(c.isprintable() for c in entry.file)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["snap"]


@pytest.mark.parametrize("name", ["\ud800", "half \udfff"])
def test_names_no_snapshot_could_hold_are_refused_at_declaration(name: str) -> None:
    with pytest.raises(RegistryError, match="a lone surrogate"):
        capture(name)(lambda x: x)
