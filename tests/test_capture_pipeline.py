"""The capture pipeline: a recording written on writer threads is the same snapshot as one
written call by call, indexed in call order; the queue's policies (block loses nothing, drop counts and names what it
dropped); flush; durability; an exception in the recorded program; GPU copies stream-ordered."""
from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import replay
from replay.recorder import cuda_runtime, pipeline, session
from replay.recorder.copies import PinnedPool
from replay.snapshot import Snapshot, files, writer
from replay.snapshot.writer import SnapshotWriter


@replay.capture("pipe_linear")
def linear(x: torch.Tensor, weight: torch.Tensor, step: int = 0) -> torch.Tensor:
    replay.tag("pre", x[:, :8] @ weight[:, :8].t())
    return x @ weight.t()


@replay.capture("pipe_scale_", mutates=("x",))
def scale_(x: torch.Tensor, factor: float) -> None:
    x.mul_(factor)


def workload(device: str = "cpu", steps: int = 6) -> None:
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 512, generator=gen).to(device)  # 128 KiB: a blob, stored once
    x = torch.randn(4, 512, generator=gen).to(device)
    for step in range(steps):
        h = linear(x, weight, step)
        scale_(h, 0.5)
        x = torch.cat([h, h], dim=1).repeat(1, 4)[:, :512] * 0.01 + x


def contents(path: Path) -> dict[str, Any]:
    """What a snapshot holds, less what differs run to run (call timings, file hashes over them,
    which segment holds a call: one a call when synchronous, one for them all here when pipelined,
    and the addresses and streams of memory footprints: only each tensor's byte count is kept)."""
    snapshot = Snapshot(path)
    calls = []
    for entry, record in zip(snapshot.entries, snapshot):
        meta = {k: v for k, v in record.meta.items() if k not in ("start_s", "duration_s", "memory", "order")}
        meta["bytes"] = {key: where["end"] - where["start"] for key, where in record.meta["memory"].items()}
        calls.append((entry.index, entry.op, entry.variant, entry.call, entry.blobs, record.provider, record.args,
                      record.launch, record.returns_json, record.blobs, meta,
                      {key: (t.dtype, t.shape, t.stride(), t.cpu().numpy().tobytes())
                       for key, t in record.tensors.items()}))
    blobs = {p.name: p.read_bytes() for p in sorted((path / "blobs").iterdir())}
    return {"calls": calls, "blobs": blobs}


def test_a_pipelined_recording_is_the_same_snapshot_as_a_synchronous_one(tmp_path: Path) -> None:
    for asynchronous in (True, False):
        with replay.recording(tmp_path / str(asynchronous), asynchronous=asynchronous):
            workload()
    pipelined, synchronous = contents(tmp_path / "True"), contents(tmp_path / "False")
    assert len(pipelined["calls"]) == 12 and len(pipelined["blobs"]) == 1
    assert pipelined == synchronous
    segments = [len(list((tmp_path / name / "segments").iterdir())) for name in ("True", "False")]
    assert segments == [1, 12]


def slow_writes(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Each call takes `seconds` longer to write."""
    held_writes(monkeypatch, lambda index: time.sleep(seconds))


def held_writes(monkeypatch: pytest.MonkeyPatch, hold: Any) -> None:
    """hold(index) runs on a writer thread before call `index` is made ready for its segment."""
    real = SnapshotWriter.call_part

    def call_part(index: int, *args: Any, **kwargs: Any) -> Any:
        hold(index)
        return real(index, *args, **kwargs)
    monkeypatch.setattr(SnapshotWriter, "call_part", staticmethod(call_part))


def test_a_full_queue_blocks_by_default_and_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slow_writes(monkeypatch, 0.02)
    with replay.recording(tmp_path / "snap", queue_depth=1) as rec:
        workload(steps=5)
    assert rec.calls_written == 10 and len(Snapshot(tmp_path / "snap")) == 10
    assert json.loads((tmp_path / "snap" / "manifest.json").read_text())["capture_errors"] == []


def test_drop_under_a_tiny_queue_counts_and_names_the_drops(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           said) -> None:
    slow_writes(monkeypatch, 0.05)
    with replay.recording(tmp_path / "snap", queue_depth=1, when_full="drop") as rec:
        workload(steps=10)
    recorded = Snapshot(tmp_path / "snap")
    assert 0 < len(recorded) < 20 and rec.calls_written == len(recorded)
    (error,) = json.loads((tmp_path / "snap" / "manifest.json").read_text())["capture_errors"]
    dropped = 20 - len(recorded)
    assert error.startswith(f"{dropped} calls not recorded: the capture queue was full (when_full='drop'): ")
    groups = re.findall(r"(\d+) (\w+) after call (\d+)", error)  # an op's drops after the same call: counted once
    assert sum(int(count) for count, _, _ in groups) == dropped
    assert len(groups) == len({(op, after) for _, op, after in groups})
    assert said() == [f"replay: capture: {error}"]
    assert sorted(e.index for e in recorded.entries) == list(range(len(recorded)))  # no gaps: drops take no index


def test_flush_puts_every_call_so_far_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slow_writes(monkeypatch, 0.01)
    with replay.recording(tmp_path / "snap"):
        workload(steps=3)
        replay.flush()
        assert len(Snapshot(tmp_path / "snap")) == 6
        workload(steps=1)
    assert len(Snapshot(tmp_path / "snap")) == 8


def test_an_exception_in_the_recorded_program_still_leaves_every_finished_call(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    slow_writes(monkeypatch, 0.01)
    with pytest.raises(KeyError, match="the program's own"):
        with replay.recording(tmp_path / "snap"):
            workload(steps=4)
            raise KeyError("the program's own")
    assert len(Snapshot(tmp_path / "snap")) == 8


@pytest.mark.parametrize("durability", ["close", "call"])
def test_durability_says_when_files_reach_the_disk(durability: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = files.os.fsync
    monkeypatch.setattr(files.os, "fsync", lambda fd: synced.append(fd) or real(fd))
    monkeypatch.setattr(writer, "git_state", lambda directory: None)  # no manifest rewrite at a moment of its own
    with replay.recording(tmp_path / "snap", durability=durability):
        before = len(synced)  # the manifest, created exclusively, is always synced
        workload(steps=2)
        replay.flush()
        during = len(synced) - before
    after = len(synced) - before - during
    if durability == "call":
        assert during >= 4 + 1 and after == 0  # each call's index line, and the segment holding them
    else:
        assert during == 0 and after >= 4 + 1  # four calls, one blob, the index and the directories, at close


@pytest.mark.parametrize("option, value, says", [("when_full", "wait", "when_full='wait'"),
                                                  ("queue_depth", 0, "queue_depth=0"),
                                                  ("durability", "never", "durability='never'")])
def test_bad_options_are_clear_errors_and_create_nothing(option: str, value: Any, says: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=says):
        with replay.recording(tmp_path / "snap", **{option: value}):
            pass
    assert not (tmp_path / "snap").exists()


def test_writers_in_parallel_still_index_calls_in_call_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first_may_go, ready = threading.Event(), []
    # the first call is made ready last; the calls of the next hand-over go to the other writer
    held_writes(monkeypatch, lambda index: (index == 0 and first_may_go.wait(30)) or ready.append(index))
    last = 2 * pipeline.HANDOFF_CALLS - 1
    with replay.recording(tmp_path / "snap") as rec:
        workload(steps=pipeline.HANDOFF_CALLS)  # two calls a step
        deadline = time.monotonic() + 30
        while last not in ready and time.monotonic() < deadline:  # made ready meanwhile, by the other writer
            time.sleep(0.01)
        assert last in ready and rec.calls_written == 0
        first_may_go.set()
    lines = (tmp_path / "snap" / "calls.jsonl").read_text().splitlines()
    assert [json.loads(line)["index"] for line in lines] == list(range(last + 1))


def test_threads_recording_through_the_pipeline_give_every_call_once(tmp_path: Path) -> None:
    with replay.recording(tmp_path / "snap", queue_depth=2):
        threads = [threading.Thread(target=workload, kwargs={"steps": 5}) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    recorded = Snapshot(tmp_path / "snap")
    assert len(recorded) == 40 and sorted(e.index for e in recorded.entries) == list(range(40))


@pytest.mark.gpu
def test_gpu_copies_are_stream_ordered_and_the_same_as_synchronous(tmp_path: Path) -> None:
    for asynchronous in (True, False):
        with replay.recording(tmp_path / str(asynchronous), asynchronous=asynchronous):
            workload("cuda")
    pipelined = contents(tmp_path / "True")
    assert pipelined == contents(tmp_path / "False") and len(pipelined["calls"]) == 12
    # an in-place kernel queued right behind the call: the input copy was taken before it ran
    x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    with replay.recording(tmp_path / "inplace"):
        scale_(x, 3.0)
        x.add_(1.0)
    (record,) = Snapshot(tmp_path / "inplace")
    assert torch.equal(record.tensors["in/x"], torch.arange(1 << 20, dtype=torch.float32))
    assert torch.equal(record.tensors["out/x"], torch.arange(1 << 20, dtype=torch.float32) * 3)


def test_the_pinned_pool_reuses_buffers_by_size_class_up_to_its_cap() -> None:
    pool = PinnedPool(max_free_bytes=8192)
    first = pool.take(5000)
    assert first.is_pinned() == torch.cuda.is_available() and first.numel() == 8192  # the next power of two
    pool.give(first)
    assert pool.take(6000) is first
    small = [pool.take(100), pool.take(100)]  # 4096 bytes each, the smallest class
    for buffer in small:
        pool.give(buffer)
    pool.give(first)  # the two small ones already fill the cap: this one is freed
    assert pool.take(8000) is not first
    reused = pool.take(10)
    assert any(reused is buffer for buffer in small)


def test_small_host_copies_leave_the_pinned_pool_as_a_writer_takes_their_call_large_ones_when_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the open segment holds its calls until written (up to segment_seconds): meanwhile the
    # program's next steps must find the small buffers free again, not pin new ones
    monkeypatch.setattr(cuda_runtime, "HOST_TWINS", ("cpu",))  # copies into pooled buffers, as a GPU's
    pool = PinnedPool()
    monkeypatch.setattr(session, "SHARED_POOL", pool)
    large = pipeline.UNPIN_BYTES // 4 + 1  # float32 elements: past the bound
    with replay.recording(tmp_path / "snap", segment_seconds=60) as recording:
        for n in range(3):
            scale_(torch.full((16,), float(n)), 2.0)
        scale_(torch.full((large,), 7.0), 2.0)
        recording.calls.hand_off()
        deadline = time.monotonic() + 10
        while recording.calls._taken < 4 and time.monotonic() < deadline:  # all four in the open segment
            time.sleep(0.01)
        assert recording.calls._taken == 4 and recording.calls.written == 0  # taken, not yet written
        free = {size: len(buffers) for size, buffers in pool._free.items()}
        assert free.get(4096) == 6  # the small calls' inputs and outputs, back already
        assert not any(size > pipeline.UNPIN_BYTES for size in free)  # the large call's, still held
    recorded = list(Snapshot(tmp_path / "snap"))
    assert [float(record.tensors["out/x"][0]) for record in recorded] == [0.0, 2.0, 4.0, 14.0]
    assert torch.equal(recorded[3].tensors["in/x"], torch.full((large,), 7.0))


def test_calls_reach_the_writers_a_few_at_a_time_and_all_are_written(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # each hand-over wakes a writer, which then takes the interpreter lock from the program: not one a call
    handed: list[int] = []
    real = pipeline.CallWriter._hand_off

    def counting(self: pipeline.CallWriter) -> None:
        handed.append(len(self._handoff))
        real(self)
    monkeypatch.setattr(pipeline.CallWriter, "_hand_off", counting)
    calls = 2 * pipeline.HANDOFF_CALLS + 3
    with replay.recording(tmp_path / "snap", segment_seconds=60):  # no writer times out meanwhile
        for n in range(calls):
            scale_(torch.full((4,), float(n)), 2.0)
    assert [n for n in handed if n] == [pipeline.HANDOFF_CALLS, pipeline.HANDOFF_CALLS, 3]  # the last at close
    recorded = Snapshot(tmp_path / "snap")
    assert [float(record.tensors["in/x"][0]) for record in recorded] == [float(n) for n in range(calls)]
    handed.clear()
    with replay.recording(tmp_path / "large", segment_seconds=60):  # a large call: a writer at once
        for n in range(3):
            scale_(torch.full((pipeline.HANDOFF_BYTES // 8,), float(n)), 2.0)  # in and out: the bound's bytes
    assert [n for n in handed if n] == [1, 1, 1] and len(Snapshot(tmp_path / "large")) == 3
