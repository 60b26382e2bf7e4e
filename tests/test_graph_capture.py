"""Calls inside CUDA graphs are recorded at every replay: staged inside the graph, written after
each replay, marked with the replay they came from, replayable; a graph captured before the
recording is reported, never a crash. The CPU twin writes a hand-made tape of staged tensors,
as a replay does."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import replay
from replay import graph_capture, recorder
from replay.cli import main
from replay.snapshot import Snapshot
from replay.snapshot.writer import SnapshotWriter
from replay.snapshot.tensors import geometry_of, storage_span


@replay.capture("graph_linear")
def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x @ weight.t()


@replay.capture("graph_scale_", mutates=("y",))
def scale_(y: torch.Tensor, factor: float) -> None:
    y.mul_(factor)


def manifest_errors(path: Path) -> list[str]:
    return json.loads((path / "manifest.json").read_text())["capture_errors"]


def replays_cleanly(path: Path) -> None:
    result = CliRunner().invoke(main, ["run", str(path), "--provider", __name__])
    assert result.exit_code == 0, result.output


def staged(key: str, t: torch.Tensor) -> graph_capture.Staged:
    """What a capture stages for `t`: a copy of its storage span, and its view's geometry."""
    geometry = geometry_of(t)
    return graph_capture.Staged(key, f"argument '{key}'", storage_span(t, geometry).clone(), geometry)


def test_a_tape_is_written_at_each_replay_from_its_staging_tensors(tmp_path: Path) -> None:
    """The CPU twin of a graph replay: the staging tensors hold what the last replay left, the
    views keep their geometry, a weight is one blob, and every call says which replay it came from."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(128, 256, generator=gen)  # 128 KiB: a weight, stored once
    x = torch.randn(256, 4, generator=gen).t()  # a transposed view: staged as its span
    spec = recorder.CallSpec("graph_linear", "default", __name__)
    tape = graph_capture.Tape(graph_id=7)
    inputs, out = staged("in/x", x), staged("out/out", linear(x, weight))
    header = {"op": "graph_linear", "variant": "default", "provider": __name__,
              "args": [{"name": "x", "tensor": "in/x"}, {"name": "weight", "tensor": "in/weight"}],
              "returns_json": {}, "launch": [], "meta": {"thread": "MainThread", "scope": {"step": 0}, "graph": 7}}
    tape.calls.append(graph_capture.CapturedCall(spec, header, [
        inputs, graph_capture.Staged("in/weight", "argument 'weight'", weight, None, reusable=True), out]))
    seen = []
    with replay.recording(tmp_path / "snap") as rec:
        for step in range(3):
            x = torch.randn(256, 4, generator=gen).t()
            inputs.tensor.copy_(storage_span(x))  # what the graph's copies do at a replay
            out.tensor.copy_(storage_span(x @ weight.t()))
            seen.append(x)
            with replay.scope("step", step + 1):
                rec.record_replay(tape)
    records = list(Snapshot(tmp_path / "snap"))
    assert [r.meta["graph_replay"] for r in records] == [1, 2, 3]
    assert [r.meta["scope"]["step"] for r in records] == [1, 2, 3] and {r.meta["graph"] for r in records} == {7}
    for record, x in zip(records, seen):
        assert record.tensors["in/x"].stride() == x.stride() and torch.equal(record.tensors["in/x"], x)
        assert torch.equal(record.tensors["out/out"], x @ weight.t())
    assert len({r.blobs["in/weight"] for r in records}) == 1
    replays_cleanly(tmp_path / "snap")


def test_replays_the_recording_cannot_follow_are_counted_and_reported_once(tmp_path: Path) -> None:
    with replay.recording(tmp_path / "snap") as rec:
        rec.record_replay(None)  # a graph captured before the recording began
        rec.record_replay(None)
    (error,) = manifest_errors(tmp_path / "snap")
    assert "2 replays of graphs captured with no recording active were not recorded" in error
    assert len(Snapshot(tmp_path / "snap")) == 0


def capture_graph(x: torch.Tensor, weight: torch.Tensor) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture, as torch asks
        scale_(linear(x, weight), 2.0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = linear(x, weight)
        scale_(y, 2.0)
    return graph, y


@pytest.mark.gpu
def test_a_graph_captured_while_recording_is_recorded_at_every_replay(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    weight = torch.randn(256, 512, device="cuda", generator=gen)  # 512 KiB: a weight
    x = torch.zeros(8, 512, device="cuda")  # the graph's input buffer, filled before each replay
    fed = [torch.randn(8, 512, device="cuda", generator=gen) for _ in range(3)]
    write_call_file = SnapshotWriter.write_call_file
    monkeypatch.setattr(SnapshotWriter, "write_call_file",
                        lambda *args, **kwargs: time.sleep(0.02) or write_call_file(*args, **kwargs))
    with replay.recording(tmp_path / "snap"):
        for _ in range(20):  # still being written when the capture begins: the writers wait for copies,
            linear(x, weight)  # a CUDA call that would break the capture, so the capture waits for them
        graph, y = capture_graph(x, weight)
        for values in fed:
            x.copy_(values)
            graph.replay()
    records = [r for r in Snapshot(tmp_path / "snap") if "graph_replay" in r.meta]
    assert [(r.op, r.meta["graph_replay"]) for r in records] == \
        [(op, n) for n in (1, 2, 3) for op in ("graph_linear", "graph_scale_")]
    for n, values in enumerate(fed):
        product = values @ weight.t()
        linear_call, scale_call = records[2 * n], records[2 * n + 1]
        assert torch.equal(linear_call.tensors["in/x"], values.cpu())
        assert torch.equal(linear_call.tensors["out/out"], product.cpu())
        assert torch.equal(scale_call.tensors["in/y"], product.cpu())
        assert torch.equal(scale_call.tensors["out/y"], (product * 2).cpu())
    assert len({r.blobs["in/weight"] for r in records[::2]}) == 1  # the weight, copied once
    assert manifest_errors(tmp_path / "snap") == []
    replays_cleanly(tmp_path / "snap")


@pytest.mark.gpu
def test_replays_of_a_graph_captured_before_the_recording_are_reported_not_recorded(tmp_path: Path) -> None:
    weight = torch.randn(256, 512, device="cuda")
    x = torch.ones(8, 512, device="cuda")
    graph, y = capture_graph(x, weight)
    with replay.recording(tmp_path / "snap"):
        graph.replay()
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, (x @ weight.t()) * 2)
    (error,) = manifest_errors(tmp_path / "snap")
    assert "2 replays of graphs captured with no recording active" in error
    assert len(Snapshot(tmp_path / "snap")) == 0


@pytest.mark.gpu
def test_the_tiny_models_graph_decode_is_recorded_at_every_step_and_replays(tmp_path: Path) -> None:
    from kernels.model import TinyLlama

    model = TinyLlama(device="cuda")
    assert model.use_cuda_graph
    model.reset()
    model.prefill([1, 2, 3])
    model.decode_step(4)  # captures the graph, no recording active
    expected = [model.decode_step(t).clone() for t in (5, 6, 7)]
    model.reset()
    model.prefill([1, 2, 3])
    model.decode_step(4)
    with replay.recording(tmp_path / "snap"):
        got = [model.decode_step(t).clone() for t in (5, 6, 7)]  # captured anew, then replayed twice
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    records = list(Snapshot(tmp_path / "snap"))
    replayed = [r for r in records if "graph_replay" in r.meta]
    eager = [r for r in records if "graph_replay" not in r.meta]
    assert len(replayed) == 2 * len(eager) and {r.meta["graph_replay"] for r in replayed} == {1, 2}
    assert sorted({r.meta["scope"]["step"] for r in replayed}) == [3, 4]  # prefill: step 0; then one a token
    replays_cleanly(tmp_path / "snap")
