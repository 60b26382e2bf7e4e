"""The dependency graph and the race check: from footprints written by hand, from the stream
clocks driven as torch.cuda's waits drive them, from a real recording, and through `replay graph`."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import replay
from replay.cli import main as cli_main
from replay.dataflow.graph import build
from replay.recorder.stream_order import StreamClocks

from tests.dataflow.conftest import DEVICE


def _call(op: str, reads: dict[str, tuple], writes: dict[str, tuple], order: dict | None = None,
          write_only: tuple[str, ...] = ()) -> dict[str, Any]:
    """A call's description with footprints: key -> (start, end[, storage[, version]])."""
    def where(t: tuple) -> dict[str, Any]:
        out = {"device": "cuda:0", "start": t[0], "end": t[1]}
        out.update({k: v for k, v in zip(("storage", "version"), t[2:])})
        return out
    memory = {**{k: where(v) for k, v in reads.items()}, **{k: where(v) for k, v in writes.items()}}
    meta: dict[str, Any] = {"memory": memory}
    if order is not None:
        meta["order"] = order
    header = {"op": op, "variant": "default", "args": [], "tensors": {}, "meta": meta}
    if write_only:
        header["triton"] = {"write_only": list(write_only)}
    return header


def test_a_read_links_to_the_call_that_wrote_those_bytes_last() -> None:
    graph = build([
        (0, _call("fill", {}, {"out/out": (100, 200, 1, 0)})),
        (1, _call("scale", {"in/x": (100, 200, 1, 0)}, {"out/out": (300, 400, 2, 0)})),
        (2, _call("overwrite_half", {}, {"out/out": (150, 200, 1, 1)})),
        (3, _call("sum", {"in/x": (100, 200, 1, 1), "in/y": (300, 400, 2, 0)}, {"out/out": (500, 504, 3, 0)})),
    ])
    links = {(e.producer, e.consumer, e.consumer_key, e.place.start, e.place.end) for e in graph.edges}
    assert links == {(0, 1, "in/x", 100, 200), (0, 3, "in/x", 100, 150), (2, 3, "in/x", 150, 200),
                     (1, 3, "in/y", 300, 400)}
    assert not graph.races


def test_bytes_of_another_storage_or_version_are_not_what_the_writer_left() -> None:
    graph = build([
        (0, _call("produce", {}, {"out/out": (100, 200, 1, 0)})),
        (1, _call("reads_reused_memory", {"in/x": (100, 200, 7, 0)}, {})),  # freed, allocated again
        (2, _call("reads_it", {"in/x": (100, 200, 1, 0)}, {})),
        (3, _call("reads_after_unrecorded_write", {"in/x": (100, 200, 1, 3)}, {})),  # version moved on
        (4, _call("reads_it_again", {"in/x": (100, 200, 1, 3)}, {})),
    ])
    assert [(e.producer, e.consumer) for e in graph.edges] == [(0, 2)]


def test_a_buffer_the_kernel_only_writes_is_no_read() -> None:
    graph = build([
        (0, _call("produce", {}, {"out/out": (100, 200, 1, 0)})),
        (1, _call("kernel", {"in/out_ptr": (100, 200, 1, 0)}, {"out/out_ptr": (100, 200, 1, 1)},
                  write_only=("out_ptr",))),
    ])
    assert graph.edges == []


def _two_streams(wait: bool) -> list[tuple[int, dict[str, Any]]]:
    """What the recorder writes for: a kernel on stream A writes a buffer, an event is recorded on A,
    stream B waits for it (or not), a kernel on B reads the buffer."""
    clocks = StreamClocks()
    event = type("Event", (), {})()
    producer = clocks.issue("cuda:0#1")
    clocks.recorded(event, "cuda:0#1")
    if wait:
        clocks.waited("cuda:0#2", event)
    consumer = clocks.issue("cuda:0#2")
    return [(0, _call("write", {}, {"out/out": (0, 4096, 1, 0)}, producer)),
            (1, _call("read", {"in/x": (1024, 2048, 1, 0)}, {"out/out": (8192, 8196, 2, 0)}, consumer))]


@pytest.mark.parametrize("wait", [False, True])
def test_a_missing_wait_between_streams_is_a_race(wait: bool) -> None:
    graph = build(_two_streams(wait))
    assert [(e.producer, e.consumer) for e in graph.edges] == [(0, 1)]
    if wait:
        assert graph.races == []
    else:
        (race,) = graph.races
        assert (race.first, race.second, race.kind) == (0, 1, "write then read")
        assert (race.place.start, race.place.end) == (1024, 2048)
        assert "calls 0 (out/out) and 1 (in/x)" in race.describe() and "1024 bytes" in race.describe()


def test_host_waits_order_what_comes_after_them() -> None:
    clocks = StreamClocks()
    event = type("Event", (), {})()
    first = clocks.issue("cuda:0#1")
    clocks.recorded(event, "cuda:0#1")
    clocks.host_waited(event=event)  # event.synchronize()
    second = clocks.issue("cuda:0#2")
    third = clocks.issue("cuda:0#1")
    clocks.host_waited(device=0)  # torch.cuda.synchronize()
    fourth = clocks.issue("cuda:0#2")
    assert second["clock"]["cuda:0#1"] >= first["clock"]["cuda:0#1"]
    assert second["clock"].get("cuda:0#1", 0) < third["clock"]["cuda:0#1"]  # issued after: not ordered
    assert fourth["clock"]["cuda:0#1"] >= third["clock"]["cuda:0#1"]


def test_a_read_then_an_unordered_write_is_a_race() -> None:
    clocks = StreamClocks()
    reader = clocks.issue("cuda:0#1")
    writer = clocks.issue("cuda:0#2")
    graph = build([(0, _call("read", {"in/x": (0, 64, 1, 0)}, {}, reader)),
                   (1, _call("write", {}, {"out/out": (0, 64, 1, 1)}, writer))])
    assert [(r.first, r.second, r.kind) for r in graph.races] == [(0, 1, "read then write")]


def test_a_recorded_prefill_links_each_layer_in_order(prefill: Path) -> None:
    from replay.dataflow.graph import of_snapshot
    from replay.snapshot import Snapshot

    graph, problems = of_snapshot(Snapshot(prefill))
    assert not problems and not graph.races and not graph.without_footprint
    ops = {n.index: n.op for n in graph.nodes}
    links = {(ops[e.producer], e.producer_key, ops[e.consumer], e.consumer_key) for e in graph.edges}
    assert ("rmsnorm", "out/out", "q4k_gemv", "in/x") in links
    assert ("kv_scatter", "out/k_cache", "attention", "in/k_cache") in links
    assert ("swiglu", "out/out", "q6k_gemv", "in/x") in links
    # the embedding lookup is not recorded: the first call reads what no recorded call wrote
    assert not [e for e in graph.edges if e.consumer == 0]
    scatter = next(n for n in graph.nodes if n.op == "kv_scatter")
    assert "state/position_buf" in scatter.state


def test_replay_graph_prints_writes_json_dot_and_a_page(tmp_path: Path) -> None:
    """A prefill in two chunks: the second chunk's kv_scatter reads the lengths the first one wrote."""
    from replay_kernels.model import TinyLlama

    snapshot, page, dot = tmp_path / "snap", tmp_path / "graph.html", tmp_path / "graph.dot"
    with replay.recording(snapshot):
        TinyLlama(device=DEVICE).prefill([1, 5, 9, 33], chunk_size=2)
    result = CliRunner().invoke(cli_main, ["graph", str(snapshot), "--html", str(page), "--dot", str(dot),
                                           "--json", str(tmp_path / "graph.json")])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())  # as printed, wrapped where the temporary path's length puts it
    assert "68 calls" in said and "no races" in said
    data = json.loads((tmp_path / "graph.json").read_text())
    assert len(data["calls"]) == 68 and data["races"] == []
    assert {"state", "in place", "data"} <= {e["kind"] for e in data["edges"]}
    text = page.read_text()
    assert text.count('class="call"') == 68 and text.count('class="edge"') == len(data["edges"])
    assert dot.read_text().startswith("digraph calls {") and dot.read_text().count("->") == len(data["edges"])


def test_replay_graph_of_a_snapshot_without_footprints_says_so() -> None:
    shipped = Path(__file__).parents[2] / "snapshots" / "prefill_001"
    result = CliRunner().invoke(cli_main, ["graph", str(shipped)])
    assert result.exit_code == 2
    assert "without memory footprints" in " ".join(result.output.split())  # wrapped where the path puts it


@pytest.mark.gpu
@pytest.mark.parametrize("wait", [False, True])
def test_replay_graph_finds_a_missing_wait_between_two_streams_on_the_gpu(tmp_path: Path, wait: bool) -> None:
    produce, consume = _stream_ops()
    buf = torch.zeros(1 << 20, device="cuda")
    side, other = torch.cuda.Stream(), torch.cuda.Stream()
    with replay.recording(tmp_path / "snap"):
        with torch.cuda.stream(side):
            produce(buf)
            done = side.record_event()
        with torch.cuda.stream(other):
            if wait:
                other.wait_event(done)
            consume(buf)
        torch.cuda.synchronize()
    result = CliRunner().invoke(cli_main, ["graph", str(tmp_path / "snap"), "--json", "-"])
    data = json.loads(result.output)
    assert [(e["producer"], e["consumer"]) for e in data["edges"]] == [(0, 1)]
    if wait:
        assert result.exit_code == 0 and data["races"] == []
    else:
        assert result.exit_code == 1
        (race,) = data["races"]
        assert (race["first"], race["second"], race["kind"]) == (0, 1, "write then read")
        assert race["end"] - race["start"] == buf.numel() * 4


def _stream_ops() -> tuple[Any, Any]:
    @replay.capture("dataflow_test_produce", mutates=("buf",))
    def produce(buf: torch.Tensor) -> None:
        buf.copy_(torch.arange(buf.numel(), device=buf.device, dtype=buf.dtype))

    @replay.capture("dataflow_test_consume")
    def consume(buf: torch.Tensor) -> torch.Tensor:
        return buf * 2
    return produce, consume


def test_the_recorders_own_waits_and_other_threads_waits_order_nothing() -> None:
    import threading

    from types import SimpleNamespace

    clocks = StreamClocks()
    event = type("Event", (), {})()
    one, two = SimpleNamespace(device_index=0, stream_id=1), SimpleNamespace(device_index=0, stream_id=2)
    clocks.issue("cuda:0#1")
    with clocks.paused():  # the recorder copying an input: its stream waits for the producer's
        clocks.on_record(event, one)
        clocks.on_wait(event, two)
        clocks.on_host_wait(event=event)
    assert "cuda:0#1" not in clocks.issue("cuda:0#2")["clock"]
    clocks.issue("cuda:0#1")
    clocks.on_record(event, one)
    waiter = threading.Thread(target=lambda: clocks.on_host_wait(event=event))  # a writer thread's wait
    waiter.start()
    waiter.join()
    assert clocks.issue("cuda:0#2")["clock"].get("cuda:0#1", 0) < 2
    clocks.on_wait(event, two)  # the program's own wait orders what follows
    assert clocks.issue("cuda:0#2")["clock"]["cuda:0#1"] == 2


def test_a_read_of_bytes_no_recorded_call_wrote_is_uninitialised(tmp_path: Path, device: str) -> None:
    """A kernel fills 20 of a fresh buffer's 21 floats; the next reads all 21."""
    from triton_launches.writes_cases import plain

    x = torch.arange(20.0, device=device)
    # torch.zeros, not empty: the same version 0 to the graph, and no garbage for the interpreter to double
    buf, out = torch.zeros(21, device=device), torch.empty(21, device=device)
    with replay.recording(tmp_path / "snap"):
        plain[(2,)](x, buf[:20], 20, BLOCK=16)
        plain[(2,)](buf, out, 21, BLOCK=16)
    result = CliRunner().invoke(cli_main, ["graph", str(tmp_path / "snap"), "--json", "-"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    (unwritten,) = data["unwritten"]
    assert (unwritten["reader"], unwritten["key"], unwritten["end"] - unwritten["start"]) == (1, "in/x_ptr", 4)
    assert unwritten["start"] == buf.data_ptr() + 80
    assert [(e["producer"], e["consumer"], e["bytes"]) for e in data["edges"]] == [(0, 1, 80)]


def test_weights_and_buffers_written_before_are_no_uninitialised_memory() -> None:
    graph = build([
        (0, _call("reads_a_weight", {"in/w": (0, 64, 1, 0)}, {"out/out": (100, 164, 2, 0)})),
        (1, _call("writes_a_zeroed_buffer", {}, {"out/out_ptr": (200, 232, 3, 2)}, write_only=("out_ptr",))
         | {"meta": {"memory": {"in/out_ptr": {"device": "cuda:0", "start": 200, "end": 264, "storage": 3,
                                                 "version": 1},
                                  "out/out_ptr": {"device": "cuda:0", "start": 200, "end": 232, "storage": 3,
                                                  "version": 2}}}}),
        (2, _call("reads_it_all", {"in/x": (200, 264, 3, 2)}, {})),
    ])
    assert graph.unwritten == []  # the buffer's version was 1 before call 1: something wrote it first
