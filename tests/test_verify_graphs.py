"""replay.verify: a checked call's reference replayed as a CUDA graph (replay/verify/reference_graphs.py).
The first check of a kind runs eagerly, the second captures the kind's graph, later ones replay it
(on a GPU the reference's Python then no longer runs); a mismatch found through a replay is named
and written as ever; a reference that cannot be captured, a busy graph, an output that does not
fit its graph and the memory bound each leave the check eager. The host twin ("cpu" added to
GRAPH_DEVICES) runs the same bookkeeping, a "replay" running the reference again into the graph's
tensors."""
from __future__ import annotations

import gc
import weakref
from pathlib import Path
from typing import Iterator

import pytest
import torch
from click.testing import CliRunner

import replay
from replay.cli import main
from replay.recorder import gather_copy
from replay.verify import Mismatch, reference_graphs, verifier
from replay.verify.reference_graphs import Graph, ReferenceGraphs, kind_of
from replay.verify.verifier import VERIFIER

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
OWNER = object()  # an op's declaration, as ReferenceGraphs.take sees it

scaled = replay.op("verify_graph_scaled", batch_axes={"x": 0, "out": 0})
reference_runs: list[int] = []  # one entry each time the reference's Python runs


@scaled.reference
def scaled_reference(x: torch.Tensor, scale: float) -> torch.Tensor:
    reference_runs.append(1)
    return (x.double() * scale).float()


@scaled.batched
def scaled_batched(x: torch.Tensor, scale: float) -> torch.Tensor:
    """Wrong by 1 in a row holding a value over 50."""
    return x * scale + (x.abs().amax(dim=1, keepdim=True) > 50).to(x.dtype)


weighted = replay.op("verify_graph_weighted", batch_axes={"x": 0, "out": 0})
weighted.reference(lambda x, w: x @ w)


@weighted.batched
def weighted_batched(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x @ w


@pytest.fixture
def graphed(device: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Checks launched by the calling thread, through graphs, on `device` (the host twin on the CPU)."""
    if device == "cpu":
        monkeypatch.setattr(verifier, "CALLER_LAUNCHES", (*verifier.CALLER_LAUNCHES, "cpu"))
        monkeypatch.setattr(reference_graphs, "GRAPH_DEVICES", (*reference_graphs.GRAPH_DEVICES, "cpu"))
    replay.verify.configure(directory=tmp_path / "mismatches", seed=0, enabled=True)
    monkeypatch.setattr(VERIFIER, "graphs", ReferenceGraphs())  # no graph, nor capture failure, of another test
    reference_runs.clear()
    yield tmp_path / "mismatches"
    replay.verify.stop("verify_graph_scaled")
    replay.verify.drain()


def checked_one_by_one(device: str, inputs: list[torch.Tensor]) -> None:
    """Each call checked and its check done before the next: the kind's graph is never busy."""
    for x in inputs:
        scaled_batched(x.to(device), 0.5)
        assert replay.verify.drain() == 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_kind_checked_again_replays_its_graph_and_a_mismatch_through_it_is_named(device: str, graphed: Path) -> None:
    found: list[Mismatch] = []
    replay.verify("verify_graph_scaled", sample=1.0, outliers=False, on_mismatch=found.append)
    captures = VERIFIER.graphs.captures
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(8, 64, generator=gen) for _ in range(6)]
    inputs[4][5, 9] = 99.0  # the fifth call is wrong in row 5: found through a replay of the graph
    checked_one_by_one(device, inputs)
    counted = replay.verify.counters()
    assert VERIFIER.graphs.captures == captures + 1  # the second check captured it; the rest replayed
    if device == "cuda":  # a replay runs no Python: the reference ran eagerly once, and once captured
        assert len(reference_runs) == 2
    assert counted["failed"] >= 1 and len(found) == 1
    assert found[0].call == 4 and found[0].rows == [5] and found[0].max_abs == pytest.approx(1.0)
    assert found[0].snapshot is not None, found[0].unwritten
    result = CliRunner().invoke(main, ["run", str(found[0].snapshot), "--provider", __name__])
    assert result.exit_code == 1 and "rows 5 wrong" in result.output, result.output
    # the graph's own tensors were rewritten by each replay: a right call after the wrong one passes
    checked_one_by_one(device, [torch.ones(8, 64)])
    assert len(found) == 1


@pytest.mark.parametrize("device", DEVICES)
def test_a_graphs_verdict_is_read_by_the_calling_thread_at_its_next_check_and_a_mismatch_goes_to_the_worker(
        device: str, graphed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Checks replayed through their kind's graph never reach the worker while they pass: the
    calling thread reads each verdict from host memory at its next check (once the reference is
    done) or at a drain; a verdict that some output disagrees is handed to the worker, which names
    the rows."""
    found: list[Mismatch] = []
    replay.verify("verify_graph_scaled", sample=1.0, outliers=False, on_mismatch=found.append)
    checked_one_by_one(device, [torch.ones(8, 64)] * 2)  # eager, then the capture
    handed: list[int] = []
    submit = VERIFIER._submit
    monkeypatch.setattr(VERIFIER, "_submit", lambda check: (handed.append(check.number), submit(check)))
    before = replay.verify.counters()
    for n in range(6):
        scaled_batched(torch.full((8, 64), float(n), device=device), 0.5)  # reads the n checks before it
        assert replay.verify.counters()["checked"] - before["checked"] == n
        if device == "cuda":  # the test's own wait: the reference is done by the next check, its graph free
            torch.cuda.synchronize()
    x = torch.ones(8, 64)
    x[3, 2] = 70.0
    scaled_batched(x.to(device), 0.5)
    assert replay.verify.drain() == 0
    assert handed == [8] and [(m.call, m.rows) for m in found] == [(8, [3])]
    assert replay.verify.counters()["checked"] - before["checked"] == 7


@pytest.mark.parametrize("device", ["cpu"])
def test_checks_waiting_to_be_read_never_crowd_out_the_checks_after_them(
        device: str, graphed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for one pending check, each call reads the landed check before it before asking
    whether there is room: every call is checked, none dropped."""
    monkeypatch.setattr(VERIFIER.settings, "queue_depth", 1)
    replay.verify("verify_graph_scaled", sample=1.0, outliers=False)
    checked_one_by_one(device, [torch.ones(2, 4)] * 2)  # eager, then the capture
    before = replay.verify.counters()
    for _ in range(20):
        scaled_batched(torch.ones(2, 4), 0.5)
    assert replay.verify.drain() == 0
    counted = replay.verify.counters()
    assert counted["checked"] - before["checked"] == 20 and counted["dropped"] == before["dropped"]


@pytest.mark.parametrize("device", ["cpu"])
def test_a_landed_check_holds_copies_not_the_programs_outputs(device: str, graphed: Path) -> None:
    replay.verify("verify_graph_scaled", sample=1.0, outliers=False)
    checked_one_by_one(device, [torch.ones(2, 4)] * 2)
    out = scaled_batched(torch.ones(2, 4), 0.5)  # replayed: its check waits to be read
    assert len(VERIFIER._landed) == 1
    gone = weakref.ref(out)
    del out
    gc.collect()
    assert gone() is None  # the program's output was let go; the check keeps the graph's copy


@pytest.mark.parametrize("device", ["cpu"])
def test_a_check_reading_a_weight_in_place_goes_to_the_worker(device: str, graphed: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker looks at a weight's version as soon as the reference is done; read later (at the
    next check), a write the program made after the reference had read it would skip the check."""
    replay.verify("verify_graph_weighted", sample=1.0, outliers=False)
    w = torch.ones(64, verifier.KEEP_BYTES // 256)  # 1 MiB: read in place
    for _ in range(2):
        weighted_batched(torch.ones(2, 64), w)
        assert replay.verify.drain() == 0
    handed: list[int] = []
    submit = VERIFIER._submit
    monkeypatch.setattr(VERIFIER, "_submit", lambda check: (handed.append(check.number), submit(check)))
    weighted_batched(torch.ones(2, 64), w)
    assert handed == [2] and not VERIFIER._landed
    assert replay.verify.drain() == 0
    replay.verify.stop("verify_graph_weighted")


@pytest.mark.parametrize("device", ["cpu"])
def test_a_disagreeing_verdict_that_cannot_reach_the_worker_still_gives_its_graph_back(
        device: str, graphed: Path, monkeypatch: pytest.MonkeyPatch, said) -> None:
    replay.verify("verify_graph_scaled", sample=1.0, outliers=False)
    checked_one_by_one(device, [torch.ones(2, 4)] * 2)
    wrong = torch.ones(2, 4)
    wrong[1, 0] = 60.0
    scaled_batched(wrong, 0.5)
    said()

    def unreachable(check: object) -> None:
        raise RuntimeError("can't start new thread")
    with monkeypatch.context() as patched:
        patched.setattr(VERIFIER, "_submit", unreachable)
        scaled_batched(torch.ones(2, 4), 0.5)  # reads the wrong one's verdict first
    assert said() == ["replay.verify: reading a check's verdict failed: RuntimeError: can't start new thread"]
    assert replay.verify.drain() == 0
    graphs = [graph for graph in VERIFIER.graphs._kinds["verify_graph_scaled"].values() if isinstance(graph, Graph)]
    assert graphs and not any(graph.busy for graph in graphs)


@pytest.mark.parametrize("device", ["cpu"])
def test_a_verdict_that_cannot_be_read_never_breaks_the_call(device: str, graphed: Path,
                                                              monkeypatch: pytest.MonkeyPatch, said) -> None:
    replay.verify("verify_graph_scaled", sample=1.0, outliers=False)
    checked_one_by_one("cpu", [torch.ones(2, 4)] * 2)  # eager, then the capture
    scaled_batched(torch.ones(2, 4), 0.5)  # replayed: its verdict waits for the next check
    said()

    def unreadable(deadline: float | None = None) -> None:
        raise RuntimeError("the device is gone")
    with monkeypatch.context() as patched:
        patched.setattr(VERIFIER, "_read_landed", unreadable)
        assert torch.equal(scaled_batched(torch.ones(2, 4), 0.5), torch.full((2, 4), 0.5))
    assert said() == ["replay.verify: reading a check's verdict failed: RuntimeError: the device is gone"]


@pytest.mark.parametrize("device", DEVICES)
def test_a_reference_that_cannot_be_captured_is_checked_eagerly_from_then_on(
        device: str, graphed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found: list[Mismatch] = []
    replay.verify("verify_graph_scaled", sample=1.0, outliers=False, on_mismatch=found.append)
    if device == "cpu":  # the host twin captures anything: make its capture fail as a GPU's would
        def refuse(graph: Graph, body: object, cuda: bool) -> None:
            raise RuntimeError("operation not permitted when stream is capturing")
        monkeypatch.setattr(reference_graphs, "capture", refuse)
    else:  # on a GPU, a reference that reads a value back on the host cannot be captured
        monkeypatch.setattr(scaled.get("reference"), "fn",
                            lambda x, scale: (x.double() * float(torch.tensor(scale, device=x.device).item())).float())
    captures = VERIFIER.graphs.captures
    inputs = [torch.full((4, 8), float(n)) for n in range(5)]
    inputs[3][2, 1] = 80.0
    checked_one_by_one(device, inputs)
    counted = replay.verify.counters()
    assert VERIFIER.graphs.captures == captures  # none captured; every check ran, eagerly
    assert [m.call for m in found] == [3] and found[0].rows == [2]
    assert counted["checked"] >= 5


def test_a_busy_graph_leaves_a_check_of_its_kind_to_run_eagerly() -> None:
    graphs = ReferenceGraphs()
    kind = kind_of("op", {"x": torch.zeros(2, 3), "scale": 0.5}, "cpu", ())
    assert graphs.take("op", kind, OWNER) is None  # met once: eagerly
    graph = graphs.take("op", kind, OWNER)
    assert isinstance(graph, Graph) and graph.busy  # met again: its graph, to capture
    assert graphs.take("op", kind, OWNER) is None  # busy: eagerly
    graphs.release(graph)
    assert graphs.take("op", kind, OWNER) is graph
    assert graphs.take("op", None, OWNER) is None  # no kind, no graph
    graphs.release(graph)
    assert graphs.take("op", kind, object()) is None  # the op declared anew: its graphs are gone


@pytest.mark.parametrize("device", DEVICES)
def test_graphs_outlive_a_verification_stopped_and_started_again(device: str, graphed: Path) -> None:
    replay.verify("verify_graph_scaled", sample=1.0, outliers=False)
    captures = VERIFIER.graphs.captures
    checked_one_by_one(device, [torch.ones(4, 4)] * 2)
    replay.verify.stop("verify_graph_scaled")
    replay.verify("verify_graph_scaled", sample=1.0, outliers=False)
    reference_runs.clear()
    checked_one_by_one(device, [torch.ones(4, 4)] * 3)
    assert VERIFIER.graphs.captures == captures + 1
    if device == "cuda":
        assert not reference_runs  # replayed, each time


def test_a_kind_is_the_arguments_shapes_strides_types_and_values_and_a_weights_address() -> None:
    x, weight = torch.zeros(4, 8), torch.zeros(8, 8)
    def kind(**arguments: object) -> object:
        return kind_of("op", arguments, "cpu", {"weight"})

    assert kind(x=x, weight=weight, eps=1e-6) == kind(x=x.clone(), weight=weight, eps=1e-6)
    assert kind(x=x, weight=weight, eps=1e-6) != kind(x=x, weight=weight, eps=1e-5)
    assert kind(x=x, weight=weight, eps=1e-6) != kind(x=torch.zeros(5, 8), weight=weight, eps=1e-6)
    assert kind(x=x, weight=weight, eps=1e-6) != kind(x=x.t(), weight=weight, eps=1e-6)  # strides
    assert kind(x=x, weight=weight, eps=1e-6) != kind(x=x.half(), weight=weight, eps=1e-6)
    assert kind(x=x, weight=weight, eps=1) != kind(x=x, weight=weight, eps=1.0)  # a value's type
    assert kind(x=x, weight=weight, eps=1e-6) != kind(x=x, weight=weight.clone(), eps=1e-6)  # read in place
    assert kind(x=x, weight=weight, eps=[1e-6]) is None  # what a graph would bake in is not known
    assert kind(x=x, weight=weight, eps=-0.0) != kind(x=x, weight=weight, eps=0.0)
    assert kind(x=x, weight=weight, eps=float("nan")) == kind(x=x, weight=weight, eps=float("nan"))
    assert kind(x=x.to_sparse(), weight=weight, eps=1e-6) is None
    assert kind(x=torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)]), weight=weight, eps=1e-6) is None
    # a host tensor in a GPU's check would be read once, at the capture: no kind
    assert kind_of("op", {"x": x, "scale": torch.tensor(2.0)}, "cuda", ()) is None


def test_graphs_past_the_memory_bound_go_least_recently_used_first_and_one_too_large_is_never_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reference_graphs, "GRAPH_BYTES", 1000)
    graphs = ReferenceGraphs()

    def captured(name: str, nbytes: int) -> tuple[object, Graph]:
        kind = kind_of(name, {}, "cpu", ())
        graphs.take(name, kind, OWNER)
        graph = graphs.take(name, kind, OWNER)
        assert graph is not None
        graph.replay, graph.nbytes = (lambda: None), nbytes
        graphs.captured(graph)
        graphs.release(graph)
        return kind, graph

    first_kind, first = captured("a", 600)
    second_kind, second = captured("b", 300)
    assert graphs.bytes == 900
    third_kind, third = captured("c", 400)  # "a" goes: the least recently used
    assert graphs.bytes == 700 and graphs.take("a", first_kind, OWNER) is None and graphs.take("b", second_kind, OWNER) is second
    graphs.release(second)
    too_large_kind, _ = captured("d", 2000)
    assert graphs.take("d", too_large_kind, OWNER) is None and graphs.bytes == 700  # too large: eagerly, always


def test_a_graph_forgotten_while_it_was_captured_is_never_counted() -> None:
    graphs = ReferenceGraphs()
    kind = kind_of("op", {}, "cpu", lambda n, v: False)
    graphs.take("op", kind, OWNER)
    graph = graphs.take("op", kind, OWNER)
    assert graph is not None
    graph.replay, graph.nbytes = (lambda: None), 1000
    graphs.uncapturable("op")  # another thread's capture of the op failed meanwhile
    graphs.captured(graph)
    graphs.release(graph)
    assert graphs.bytes == 0 and graphs.take("op", kind, OWNER) is None


def test_a_gate_reading_every_call_reads_calls_numbered_out_of_order() -> None:
    """With threads, call 2 may reach the gate before call 1: with a share of 1 neither is skipped."""
    policy = verifier.Policy(scaled, 0.0, None, True)
    VERIFIER.schedule_note(policy, 2)
    assert policy.next_note == 0
    shared = verifier.Policy(scaled, 0.0, None, 0.5)
    VERIFIER.schedule_note(shared, 2)
    assert shared.next_note > 2


positives = replay.op("verify_graph_positives", batch_axes={})


@positives.reference
def positives_reference(x: torch.Tensor) -> torch.Tensor:
    return x[x > 0].double().float()


@positives.batched
def positives_batched(x: torch.Tensor) -> torch.Tensor:
    """Its output's size depends on the values (a GPU cannot capture that: the host twin's case)."""
    return x[x > 0]


@positives.single
def positives_first_three(x: torch.Tensor) -> torch.Tensor:
    """Right while the first three elements are the positive ones."""
    return x[:3]


@pytest.mark.parametrize("device", ["cpu"])
def test_a_reference_whose_output_shape_follows_the_values_is_checked_eagerly_and_fails_as_eagerly(
        device: str, graphed: Path) -> None:
    """The host twin cannot hold such a reference any more than a CUDA graph could: the check
    whose replay would not fit goes eager, and its mismatch is found."""
    found: list[Mismatch] = []
    replay.verify("verify_graph_positives", sample=1.0, outliers=False, on_mismatch=found.append)
    try:
        for positives in (3, 3, 5):
            x = torch.zeros(16)
            x[:positives] = 1.0
            positives_first_three(x.to(device))
            assert replay.verify.drain() == 0
        assert [m.call for m in found] == [2]
    finally:
        replay.verify.stop("verify_graph_positives")


@pytest.mark.parametrize("device", ["cpu"])
def test_an_output_that_does_not_fit_its_graph_is_checked_eagerly_and_the_graph_goes(
        device: str, graphed: Path) -> None:
    found: list[Mismatch] = []
    replay.verify("verify_graph_positives", sample=1.0, outliers=False, on_mismatch=found.append)
    captures = VERIFIER.graphs.captures
    try:
        for positives in (3, 3, 3, 5, 5, 5):  # the kind stays: 16 elements
            x = torch.zeros(16)
            x[:positives] = 1.0
            positives_batched(x.to(device))
            assert replay.verify.drain() == 0
        assert not found and replay.verify.counters()["checked"] >= 6
        # captured at the second call; unfit at the fourth (checked eagerly, the graph gone); met anew
        # at the fifth, captured again at the sixth
        assert VERIFIER.graphs.captures == captures + 2
    finally:
        replay.verify.stop("verify_graph_positives")


touchy = replay.op("verify_graph_touchy", batch_axes={"x": 0, "out": 0})


@touchy.reference
def touchy_reference(x: torch.Tensor) -> torch.Tensor:
    return (x.double() * 2).float()


@touchy.batched
def touchy_batched(x: torch.Tensor) -> torch.Tensor:
    """Raises (the program's own error) where x holds a value over 100."""
    if bool((x > 100).any()):
        raise ValueError("out of range")
    return x * 2


@pytest.mark.parametrize("device", DEVICES)
def test_a_call_that_raises_while_its_kind_has_a_graph_leaves_the_graph_free(device: str, graphed: Path) -> None:
    replay.verify("verify_graph_touchy", sample=1.0, outliers=False)
    try:
        x = torch.ones(4, 4, device=device)
        touchy_batched(x)  # met once
        assert replay.verify.drain() == 0
        with pytest.raises(ValueError, match="out of range"):
            touchy_batched(x * 1000)  # met again: its graph taken, the call raises
        assert replay.verify.drain() == 0 and VERIFIER.graphs.captures == 0
        touchy_batched(x)  # the graph was given back: captured now
        assert replay.verify.drain() == 0 and VERIFIER.graphs.captures == 1
    finally:
        replay.verify.stop("verify_graph_touchy")


@pytest.mark.parametrize("device", DEVICES)
def test_a_checks_copies_go_through_the_graphs_table_where_they_are_contiguous_and_torchs_copy_elsewhere(
        device: str, graphed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copies into a graph's statics: one launch of byte runs where every tensor is contiguous,
    torch's multi-tensor copy where one is not (a transposed view); a mismatch is found either way."""
    launched: list[int] = []
    launch = gather_copy.FixedCopies.launch
    monkeypatch.setattr(gather_copy.FixedCopies, "launch",
                        lambda self, sources: (launched.append(len(sources)), launch(self, sources)))
    found: list[Mismatch] = []
    replay.verify("verify_graph_scaled", sample=1.0, outliers=False, on_mismatch=found.append)
    gen = torch.Generator().manual_seed(0)
    for layout, transposed in (("contiguous", False), ("transposed", True)):
        inputs = [torch.randn(64, 8, generator=gen) for _ in range(4)]
        inputs[3][9, 5] = 99.0  # the fourth call is wrong in row 5 (of the [8, 64] argument)
        launched.clear()
        checked_one_by_one(device, [x.t() if transposed else x.t().contiguous() for x in inputs])
        # the third and fourth checks replay: their input and output copies, one source each
        assert launched == ([] if transposed else [1, 1, 1, 1]), layout
        assert [m.rows for m in found] == [[5]], layout
        found.clear()


def test_a_value_whose_bytes_are_not_its_values_is_copied_by_torch_into_its_static() -> None:
    """A conjugate view holds its values' bytes unconjugated, a negative view negated, and a
    wrapper subclass's address is none of its data: torch copies them; a plain tensor's bytes go
    through the table."""
    class Wrapped(torch.Tensor):
        pass

    base = torch.tensor([1 + 2j, 3 - 4j])
    assert not reference_graphs._bytes_as_they_read(base.conj())
    assert not reference_graphs._bytes_as_they_read(base.conj().imag)  # a negative view
    assert not reference_graphs._bytes_as_they_read(torch.ones(3).as_subclass(Wrapped))
    assert reference_graphs._bytes_as_they_read(torch.ones(3))
    graph = Graph(("op",))
    for n in range(3):  # made, then copied into twice
        value = (base + n).conj()
        held = reference_graphs.copy_into(graph, "inputs", {"x": value})["x"]
        assert torch.equal(held.resolve_conj(), value.resolve_conj()), n
