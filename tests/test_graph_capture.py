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
from replay.recorder import graphs
from replay.recorder.session import Recording
from replay.recorder.staging import CallSpec, Tensor
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


def tensor(key: str, what: str, value: torch.Tensor) -> Tensor:
    """A tensor of a call, as the recorder's walk over it hands it on."""
    return Tensor(key, what, value, geometry_of(value))


def manifest_errors(path: Path) -> list[str]:
    return json.loads((path / "manifest.json").read_text())["capture_errors"]


def replays_cleanly(path: Path) -> None:
    result = CliRunner().invoke(main, ["run", str(path), "--provider", __name__])
    assert result.exit_code == 0, result.output


def linear_tape(x: torch.Tensor, weight: torch.Tensor) -> tuple[graphs.Tape, graphs.Staged,
                                                                 graphs.Staged]:
    """What capturing `linear(x, weight)` into graph 7 leaves: a tape of one call, the staging spans
    of x and of the output (views into the tape's slabs), and the weight, read in place."""
    spec = CallSpec("graph_linear", "default", __name__)
    tape = graphs.Tape(graph_id=7)
    inputs = tape.stage(tensor("in/x", "argument 'x'", x))
    out = tape.stage(tensor("out/out", "output 'out'", linear(x, weight)))
    header = {"op": "graph_linear", "variant": "default", "provider": __name__,
              "args": [{"name": "x", "tensor": "in/x"}, {"name": "weight", "tensor": "in/weight"}],
              "returns_json": {}, "launch": [], "meta": {"thread": "MainThread", "scope": {"step": 0}, "graph": 7}}
    tape.calls.append(graphs.CapturedCall(spec, header, [
        inputs, tape.weight(tensor("in/weight", "argument 'weight'", weight)), out]))
    return tape, inputs, out


def replay_tape(rec: Recording, tape: graphs.Tape, inputs: graphs.Staged,
                out: graphs.Staged, x: torch.Tensor, weight: torch.Tensor, step: int) -> None:
    """What a replay of the graph does to its staging spans, then what the recording does after it."""
    inputs.tensor.copy_(storage_span(x))
    out.tensor.copy_(storage_span(x @ weight.t()))
    with replay.scope("step", step):
        rec.record_replay(tape)


def test_a_tape_is_written_at_each_replay_from_its_staging_tensors(tmp_path: Path) -> None:
    """The CPU twin of a graph replay: the staging spans hold what the last replay left, the
    views keep their geometry, a weight is one blob, and every call says which replay it came from."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(128, 256, generator=gen)  # 128 KiB: a weight, stored once
    tape, inputs, out = linear_tape(torch.randn(256, 4, generator=gen).t(), weight)  # x: a transposed view
    assert len(tape.slabs) == 1 and inputs.slab == out.slab == 0 and out.offset >= inputs.nbytes
    seen = []
    with replay.recording(tmp_path / "snap") as rec:
        for step in range(3):
            seen.append(torch.randn(256, 4, generator=gen).t())
            replay_tape(rec, tape, inputs, out, seen[-1], weight, step + 1)
    records = list(Snapshot(tmp_path / "snap"))
    assert [r.meta["graph_replay"] for r in records] == [1, 2, 3]
    assert [r.meta["scope"]["step"] for r in records] == [1, 2, 3] and {r.meta["graph"] for r in records} == {7}
    for record, x in zip(records, seen):
        assert record.tensors["in/x"].stride() == x.stride() and torch.equal(record.tensors["in/x"], x)
        assert torch.equal(record.tensors["out/out"], x @ weight.t())
    assert len({r.blobs["in/weight"] for r in records}) == 1
    replays_cleanly(tmp_path / "snap")
    with replay.recording(tmp_path / "again") as rec:  # the same graph, replayed under a new recording
        replay_tape(rec, tape, inputs, out, seen[0], weight, 1)
    (record,) = Snapshot(tmp_path / "again")
    assert record.meta["graph_replay"] == 4 and torch.equal(record.tensors["in/weight"], weight)  # its own blob


def test_a_flight_recording_holds_the_last_calls_of_its_replays_and_a_weight_once(tmp_path: Path) -> None:
    """A replay is held whole (its slabs, one host copy each) and cut at the front when the ring
    holds more calls than asked; a weight changed in place between replays is taken again."""
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(128, 256, generator=gen)
    tape, inputs, out = linear_tape(torch.randn(256, 4, generator=gen).t(), weight)
    tape.calls.append(tape.calls[0])  # two calls a replay
    seen = []
    with replay.recording(tmp_path / "snap", ring=3) as rec:
        for step in range(4):
            if step == 3:
                weight.mul_(2)  # a version bump: the next replay copies the weight again
            seen.append(torch.randn(256, 4, generator=gen).t())
            replay_tape(rec, tape, inputs, out, seen[-1], weight, step + 1)
        assert replay.dump() == 3
    records = list(Snapshot(tmp_path / "snap"))
    assert [(r.index, r.meta["graph_replay"]) for r in records] == [(5, 3), (6, 4), (7, 4)]
    assert torch.equal(records[0].tensors["in/x"], seen[2]) and torch.equal(records[2].tensors["in/x"], seen[3])
    assert torch.equal(records[2].tensors["out/out"], seen[3] @ weight.t())
    assert records[0].blobs["in/weight"] != records[1].blobs["in/weight"] == records[2].blobs["in/weight"]
    assert torch.equal(records[0].tensors["in/weight"], weight / 2)


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
    call_part = SnapshotWriter.call_part
    monkeypatch.setattr(SnapshotWriter, "call_part",
                        staticmethod(lambda *args, **kwargs: time.sleep(0.02) or call_part(*args, **kwargs)))
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
    from replay_kernels.model import TinyLlama

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


def test_a_capture_stages_a_tensor_once_and_copies_it_before_a_write_or_at_the_end(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An output read unchanged by the next call is one staging span; its copy is put off until a
    call declares it writes that storage, or to the end of the graph; another view, or a version
    moved by a write through torch, is staged anew; a write the recorder did not see is reported."""
    monkeypatch.setattr(graphs, "_default_pool_ranges", lambda: [])  # no CUDA allocator here
    capture = graphs.Capture()
    out = torch.arange(64.0)
    produced = capture.stage("f", tensor("out/out", "output 'out'", out))
    read = capture.stage("g", tensor("in/x", "argument 'x'", out))
    assert (read.slab, read.offset, read.key) == (produced.slab, produced.offset, "in/x")
    assert capture.stage("g", tensor("in/x", "argument 'x'", out[:32])).offset != produced.offset  # another view
    capture.before_write([out[:8]])  # a call about to write the storage: its spans are copied first
    assert torch.equal(produced.tensor, torch.arange(64.0))
    out.add_(1)
    changed = capture.stage("h", tensor("in/x", "argument 'x'", out))
    assert changed.offset != produced.offset
    other = torch.zeros(4)
    unseen = capture.stage("h", tensor("in/y", "argument 'y'", other))
    other.fill_(3)  # written in place where no declared write warned the capture
    capture.finish()
    assert torch.equal(changed.tensor, torch.arange(64.0) + 1) and torch.equal(unseen.tensor, torch.full((4,), 3.0))
    assert torch.equal(produced.tensor, torch.arange(64.0))  # what the first call wrote, kept
    assert capture.tape.written_later == ["op 'h' argument 'y'"]


def test_calls_made_during_a_capture_are_taped_with_their_values_at_the_call(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU twin of capturing: the recorder's path for calls inside a capture, run as if one
    were under way. An op's input is staged before the op that writes it, its output after, and
    the output the next call reads is the same staging span."""
    monkeypatch.setattr(graphs, "_default_pool_ranges", lambda: [])
    gen = torch.Generator().manual_seed(2)
    x, weight = torch.randn(8, 16, generator=gen), torch.randn(4, 16, generator=gen)
    with replay.recording(tmp_path / "snap") as rec:
        capture = graphs.Capture()
        monkeypatch.setattr(graphs._local, "capture", capture, raising=False)
        scale_(linear(x, weight), 2.0)
        monkeypatch.setattr(graphs._local, "capture", None)
        capture.finish()
        rec.record_replay(capture.tape)  # on the CPU nothing runs again: the values of the capture
    linear_call, scale_call = Snapshot(tmp_path / "snap")
    assert (linear_call.op, scale_call.op) == ("graph_linear", "graph_scale_")
    assert torch.equal(linear_call.tensors["in/x"], x) and torch.equal(scale_call.tensors["in/y"], x @ weight.t())
    assert torch.equal(scale_call.tensors["out/y"], (x @ weight.t()) * 2)
    assert manifest_errors(tmp_path / "snap") == []
    replays_cleanly(tmp_path / "snap")


class _NotJson:
    factor = 2.0


@replay.capture("graph_scale_by_", mutates=("y",))
def scale_by_(y: torch.Tensor, how: object) -> None:
    y.data.mul_(how.factor)  # as a kernel writes: through the storage, no version moved


def test_a_call_left_off_the_tape_still_has_what_it_writes_copied_first(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A mutating call that cannot be taped (an argument that is not JSON) runs with the copies
    put off of what it writes made before it: the call before keeps the value it returned."""
    monkeypatch.setattr(graphs, "_default_pool_ranges", lambda: [])
    x, weight = torch.randn(4, 8), torch.randn(3, 8)
    with replay.recording(tmp_path / "snap") as rec:
        capture = graphs.Capture()
        monkeypatch.setattr(graphs._local, "capture", capture, raising=False)
        scale_by_(linear(x, weight), _NotJson())
        monkeypatch.setattr(graphs._local, "capture", None)
        capture.finish()
        rec.record_replay(capture.tape)
    (record,) = Snapshot(tmp_path / "snap")
    assert torch.equal(record.tensors["out/out"], x @ weight.t())


def test_slabs_stay_near_what_is_staged() -> None:
    """A large span gets a slab of its own; small spans after it go on filling the open slab."""
    tape = graphs.Tape(graph_id=1)
    small = tape.stage(tensor("in/a", "argument 'a'", torch.zeros(16)))
    large = tape.stage(tensor("in/b", "argument 'b'", torch.zeros(graphs.SLAB_BYTES)))  # 4 MiB of floats
    after = tape.stage(tensor("in/c", "argument 'c'", torch.zeros(16)))
    assert [slab.numel() for slab in tape.slabs] == [graphs.SLAB_BYTES, 4 * graphs.SLAB_BYTES]
    assert (small.slab, large.slab, after.slab) == (0, 1, 0) and after.offset == 64


def _capture_twin(rec: Recording, x: torch.Tensor, weight: torch.Tensor,
                  monkeypatch: pytest.MonkeyPatch) -> tuple[graphs.Tape, torch.Tensor]:
    """The CPU twin of capturing `scale_(linear(x, weight), 2.0)` under `rec`: its tape (with a
    device ring in a flight recording) and the output buffer the graph would write."""
    capture = graphs.Capture(ring=rec.device_ring_plan())
    monkeypatch.setattr(graphs._local, "capture", capture, raising=False)
    y = linear(x, weight)
    scale_(y, 2.0)
    monkeypatch.setattr(graphs._local, "capture", None)
    capture.finish()
    capture.filled()
    return capture.tape, y


def _replay_twin(rec: Recording, tape: graphs.Tape, x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor,
                 values: torch.Tensor, seen: bool = True) -> None:
    """What a replay of that graph does on a GPU: the calls write their buffers (done here by
    hand, between the copies as the kernels would), the graph's copy launches run, and the
    recording takes the replay (unless it is not `seen`: one made while no recording ran)."""
    x.copy_(values)
    y.copy_(values @ weight.t())
    for launch in tape.copies[:-1]:  # before scale_ writes y: its input copied
        graphs.run_copy(tape, launch)
    y.mul_(2)
    graphs.run_copy(tape, tape.copies[-1])
    if seen:
        rec.record_replay(tape)


def test_a_flight_recordings_device_ring_holds_what_a_full_recording_writes(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU twin of the device ring: a flight recording's graph copies every replay's spans into
    the next ring slot (a counter the copy launch itself turns), nothing crosses until the dump, and
    what the dump writes is, call for call and bit for bit, what a full recording of the same
    replays wrote last; a slot a later replay reused is gone; replays no recording saw (the graph
    outlives recordings) do not shift the slots."""
    monkeypatch.setattr(graphs, "_default_pool_ranges", lambda: [])
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(4, 16, generator=gen)
    fed = [torch.randn(8, 16, generator=gen) for _ in range(5)]
    written = {}
    for name, options in (("full", {}), ("ring", {"ring": 4})):
        x = torch.zeros(8, 16)
        with replay.recording(tmp_path / name, **options) as rec:
            tape, y = _capture_twin(rec, x, weight, monkeypatch)
            _replay_twin(rec, tape, x, y, weight, torch.ones(8, 16), seen=False)
            for values in fed:
                _replay_twin(rec, tape, x, y, weight, values)
            if name == "ring":
                assert tape.ring is not None and tape.ring.slots == 3  # 2 replays of 2 calls held, 1 under way
                assert int(tape.counter[0]) == 6 and rec._from_device_ring(tape, 2, {}) is None  # reused by 5
                assert replay.dump() == 4
            else:
                assert tape.ring is None
        written[name] = list(Snapshot(tmp_path / name))
    full, ring = written["full"], written["ring"]
    assert [(r.op, r.meta["graph_replay"]) for r in ring] == [(r.op, r.meta["graph_replay"]) for r in full[-4:]]
    assert [r.meta["graph_replay"] for r in ring] == [4, 4, 5, 5]
    for got, want in zip(ring, full[-4:]):
        assert got.tensors.keys() == want.tensors.keys()
        assert all(torch.equal(got.tensors[k], want.tensors[k]) for k in want.tensors)
    assert torch.equal(ring[-1].tensors["in/y"], fed[-1] @ weight.t())
    assert torch.equal(ring[-1].tensors["out/y"], 2 * (fed[-1] @ weight.t()))
    replays_cleanly(tmp_path / "ring")


@pytest.mark.gpu
def test_a_flight_recording_of_the_graph_decode_dumps_what_a_full_recording_wrote(tmp_path: Path) -> None:
    """The device ring on the GPU: the tiny model's graph decode recorded whole and as a flight
    recording; the dump's calls are the full recording's last ones, bit for bit."""
    from replay_kernels.model import TinyLlama

    model = TinyLlama(device="cuda")
    written = {}
    for name, options in (("full", {}), ("ring", {"ring": 40})):
        model.reset()
        model.prefill([1, 2, 3])
        model.decode_step(4)
        with replay.recording(tmp_path / name, **options):
            for token in range(5, 11):  # captured anew, then replayed 5 times
                model.decode_step(token)
            tape = graphs.tape_of(model._graph)
            assert tape is not None and (tape.ring is not None) == (name == "ring")
            if name == "ring":
                assert replay.dump() == 40
        written[name] = list(Snapshot(tmp_path / name))
    ring, full = written["ring"], written["full"][-40:]
    assert [(r.op, r.meta["graph_replay"]) for r in ring] == [(r.op, r.meta["graph_replay"]) for r in full]
    assert {r.meta["graph_replay"] for r in ring} <= {4, 5} and ring[-1].meta["graph_replay"] == 5
    for got, want in zip(ring, full):
        assert got.tensors.keys() == want.tensors.keys()
        assert all(torch.equal(got.tensors[k], want.tensors[k]) for k in want.tensors), got.op
    replays_cleanly(tmp_path / "ring")


def test_a_dump_reads_a_graphs_ring_once_however_the_program_replays_meanwhile(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Replays held on the device are read in one go (while no replay of the graph starts): a
    replay the program makes while the dump brings the held ones over, on the signal thread say,
    cannot put its bytes into them; and a dump that cannot read the ring says so and does not
    raise in place of the program's own error."""
    monkeypatch.setattr(graphs, "_default_pool_ranges", lambda: [])
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(4, 16, generator=gen)
    fed = [torch.randn(8, 16, generator=gen) for _ in range(6)]
    x = torch.zeros(8, 16)
    with replay.recording(tmp_path / "snap", ring=4) as rec:
        tape, y = _capture_twin(rec, x, weight, monkeypatch)
        for values in fed[:3]:
            _replay_twin(rec, tape, x, y, weight, values)
        assert rec.ring is not None
        held, _, _ = rec.ring.take()
        taken: dict = {}
        assert held[0].bring_over(taken)
        for values in fed[3:]:  # these fill every slot of the ring again
            _replay_twin(rec, tape, x, y, weight, values)
        assert held[1].bring_over(taken)
        for pending, values in zip(held, fed[1:3]):
            linear_call = pending.calls()[0]
            assert torch.equal(linear_call.copies["in/x"].span.view(torch.float32).view(8, 16), values)
        tape.counter = torch.zeros(2, dtype=torch.int64, device="meta")  # a ring that cannot be read
        assert replay.dump() == 0
    assert any("reading the graph's device ring failed" in e for e in manifest_errors(tmp_path / "snap"))


def test_rings_share_the_recordings_budget_and_a_ring_too_small_for_a_recording_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every graph of a flight recording takes its ring out of one ring_bytes; one that does not
    fit gets none. A graph captured under a smaller ring, replayed under a flight recording that
    holds more, comes over to the host at every replay: nothing it holds is lost."""
    plan = graphs.RingPlan(calls=8, max_bytes=10_000)
    assert plan.held(2, 1000) == 4 and plan.take(2, 1000) == 5  # 4 replays held, 1 under way
    assert plan.take(2, 1000) == 5 and plan.take(2, 1000) == 0  # the third graph does not fit
    assert graphs.RingPlan(calls=8, max_bytes=3000).held(2, 1000) == 3  # the host ring's bytes bound it too
    monkeypatch.setattr(graphs, "_default_pool_ranges", lambda: [])
    weight, x = torch.randn(4, 16), torch.zeros(8, 16)
    with replay.recording(tmp_path / "small", ring=2) as rec:
        tape, y = _capture_twin(rec, x, weight, monkeypatch)
    assert tape.ring is not None and tape.ring.slots == 2
    fed = [torch.full((8, 16), float(n)) for n in range(5)]
    with replay.recording(tmp_path / "large", ring=100) as rec:
        for values in fed:
            _replay_twin(rec, tape, x, y, weight, values)
        assert replay.dump() == 10
    records = list(Snapshot(tmp_path / "large"))
    assert [torch.equal(r.tensors["in/x"], v) for r, v in zip(records[::2], fed)] == [True] * 5


@replay.capture("graph_tag_then_write", mutates=("y",))
def tag_then_write(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z = x * 2
    replay.tag("z", z)
    replay.tag("y_before", y)  # memory the call declares it writes: copied at the tag
    y.mul_(3)
    z.add_(100)  # written after its tag, through torch
    return z


def test_tags_inside_a_capture_are_staged_and_one_written_after_it_is_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Inside a capture a tag is staged with the outputs, not copied at the tag: a tag of memory
    the call writes is still copied at the tag, and a write through torch after a tag is said."""
    monkeypatch.setattr(graphs, "_default_pool_ranges", lambda: [])
    x, y = torch.arange(4.0), torch.ones(4)
    with replay.recording(tmp_path / "snap") as rec:
        capture = graphs.Capture()
        monkeypatch.setattr(graphs._local, "capture", capture, raising=False)
        tag_then_write(x, y)
        monkeypatch.setattr(graphs._local, "capture", None)
        capture.finish()
        capture.filled()
        rec.record_replay(capture.tape)
    (record,) = Snapshot(tmp_path / "snap")
    assert torch.equal(record.tensors["tag/y_before"], torch.ones(4))
    assert torch.equal(record.tensors["tag/z"], x * 2 + 100)  # as the call left it, and said
    (error,) = manifest_errors(tmp_path / "snap")
    assert "tag(s) z written after they were taken" in error


@replay.capture("graph_scale_by_host")
def scale_by_host(y: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    return y * float(factor[0])  # a factor in host memory: read when captured, as CUDA graphs do


@pytest.mark.gpu
def test_a_host_tensor_of_a_captured_call_is_copied_at_the_capture_not_by_the_graph(tmp_path: Path) -> None:
    """The graph's copy kernel reaches only its device's memory: a call's tensor in host memory is
    staged once, at the capture (its value then, the one the graph baked in), beside the CUDA
    tensors each replay refreshes in the device ring."""
    x = torch.zeros(8, 16, device="cuda")
    factor = torch.tensor([3.0])
    fed = [torch.full((8, 16), float(n), device="cuda") for n in range(4)]
    with replay.recording(tmp_path / "snap", ring=3):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = scale_by_host(x, factor)
        for values in fed:
            x.copy_(values)
            graph.replay()
        torch.cuda.synchronize()
        assert replay.dump() == 3
    records = list(Snapshot(tmp_path / "snap"))
    assert [r.meta["graph_replay"] for r in records] == [2, 3, 4]
    for record, values in zip(records, fed[1:]):
        assert torch.equal(record.tensors["in/y"], values.cpu())
        assert torch.equal(record.tensors["in/factor"], factor)
        assert torch.equal(record.tensors["out/out"], (values * 3).cpu())
    assert torch.equal(out, fed[-1] * 3)
