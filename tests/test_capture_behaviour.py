"""What a recording holds for a call, and how capture fails without crashing the program."""
from __future__ import annotations

import errno
import inspect
import json
from pathlib import Path
from typing import Callable

import pytest
import torch

import replay
from replay import context, recorder
from replay.errors import CaptureError, SnapshotError
from replay.snapshot import Snapshot, writer


@replay.capture("cap_scale_inplace", mutates=("x",))
def scale_(x: torch.Tensor, factor: float) -> None:
    x.mul_(factor)


@replay.capture("cap_advance", state=("position_buf",))
def advance(x: torch.Tensor, position_buf: torch.Tensor) -> torch.Tensor:
    return x[position_buf.long()]


@replay.capture("cap_takes_anything")
def takes_anything(x: torch.Tensor, extra: object = None) -> torch.Tensor:
    return x + 1


@replay.capture("cap_tagged")
def tagged(x: torch.Tensor) -> torch.Tensor:
    y = replay.tag("doubled", x * 2)
    replay.tag("detail", y + 1, level=2)
    replay.record_launch("tagged_kernel", (4, 1, 1), path="direct", num_warps=4, stream=object())
    return y


def stderr_capture_lines(said) -> list[str]:
    return [line for line in said() if line.startswith("replay: capture:")]


def manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


def test_in_place_kernel_replays_from_its_true_inputs(tmp_path: Path) -> None:
    x = torch.arange(6.0)
    with replay.recording(tmp_path / "snap"):
        scale_(x, 3.0)
    record = Snapshot(tmp_path / "snap").load(0)
    assert torch.equal(record.tensors["in/x"], torch.arange(6.0))  # copied before the call
    assert torch.equal(record.tensors["out/x"], torch.arange(6.0) * 3)  # recorded after it
    replayed = record.tensors["in/x"].clone()
    scale_(replayed, **{k: v for k, v in record.arguments().items() if k != "x"})
    assert torch.equal(replayed, record.tensors["out/x"])


def test_state_arguments_are_stored_under_state(tmp_path: Path) -> None:
    with replay.recording(tmp_path / "snap"):
        advance(torch.arange(10.0), torch.tensor([3, 4], dtype=torch.int32))
    record = Snapshot(tmp_path / "snap").load(0)
    assert set(record.tensors) == {"in/x", "state/position_buf", "out/out"}
    assert torch.equal(record.role("state")["position_buf"], torch.tensor([3, 4], dtype=torch.int32))
    assert [a["tensor"] for a in record.args] == ["in/x", "state/position_buf"]


def test_tags_and_launches_are_recorded_into_their_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAY_TAGS", "2")
    with replay.recording(tmp_path / "snap"):
        tagged(torch.ones(3))
    record = Snapshot(tmp_path / "snap").load(0)
    assert torch.equal(record.role("tag")["doubled"], torch.full((3,), 2.0))
    assert torch.equal(record.role("tag")["detail"], torch.full((3,), 3.0))
    (launch,) = record.launch
    assert launch["kernel"] == "tagged_kernel" and launch["grid"] == [4, 1, 1]
    assert launch["path"] == "direct" and launch["num_warps"] == 4
    assert launch["stream"].startswith("<object object")  # not JSON: kept as its repr, never raised


@pytest.mark.parametrize("level, tags", [("0", set()), ("1", {"doubled"}), ("2", {"doubled", "detail"})])
def test_tag_levels(level: str, tags: set[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAY_TAGS", level)
    with replay.recording(tmp_path / "snap"):
        tagged(torch.ones(3))
    assert set(Snapshot(tmp_path / "snap").load(0).role("tag")) == tags


def test_bad_tag_level_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAY_TAGS", "3")
    with pytest.raises(CaptureError, match="REPLAY_TAGS='3'"):
        replay.recording(tmp_path / "snap").__enter__()
    assert recorder.active() is None


def test_non_json_argument_is_reported_once_and_the_call_skipped(tmp_path: Path,
                                                                said) -> None:
    with replay.recording(tmp_path / "snap"):
        results = [takes_anything(torch.zeros(2), extra=object()) for _ in range(3)]
        takes_anything(torch.zeros(2), extra="fine")
    assert all(torch.equal(r, torch.ones(2)) for r in results)  # the program went on
    (line,) = stderr_capture_lines(said)
    assert "op 'cap_takes_anything'" in line and "argument 'extra'" in line
    assert manifest(tmp_path / "snap")["capture_errors"] == [line.removeprefix("replay: capture: ")]
    snapshot = Snapshot(tmp_path / "snap")
    assert len(snapshot) == 1 and snapshot.load(snapshot.entries[0]).arguments()["extra"] == "fine"


def test_unsupported_tensor_dtype_names_op_and_argument(tmp_path: Path, said) -> None:
    with replay.recording(tmp_path / "snap") as rec:
        takes_anything(torch.zeros(2, dtype=torch.complex64))
        takes_anything(torch.zeros(2))
    (line,) = stderr_capture_lines(said)
    assert "op 'cap_takes_anything': argument 'x'" in line and "complex64" in line
    assert not rec.stopped and len(Snapshot(tmp_path / "snap")) == 1


def test_strict_mode_raises_on_non_json_argument(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAY_CAPTURE_STRICT", "1")
    with replay.recording(tmp_path / "snap"):
        with pytest.raises(CaptureError, match="op 'cap_takes_anything': argument 'extra'"):
            takes_anything(torch.zeros(2), extra=object())


def failing_in(directory: str, real: Callable[..., None]) -> Callable[..., None]:
    """write_atomic failing as on a full disk inside `directory`; the manifest can still be written."""
    def write(path: Path, data: bytes, **options: bool) -> None:
        if path.parent.name == directory:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data, **options)
    return write


@pytest.mark.parametrize("directory", [writer.SEGMENTS_DIR, writer.BLOBS_DIR])
def test_write_failure_is_reported_once_and_capture_stops(directory: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          said) -> None:
    weight = torch.zeros(128, 128)  # 64 KiB: stored as a blob
    with replay.recording(tmp_path / "snap") as rec:
        takes_anything(torch.zeros(2))
        replay.flush()  # on disk before the disk fills
        monkeypatch.setattr(writer, "write_atomic", failing_in(directory, writer.write_atomic))
        results = [takes_anything(weight) for _ in range(3)]
    assert all(torch.equal(r, torch.ones(128, 128)) for r in results)
    assert rec.stopped
    (line,) = stderr_capture_lines(said)
    assert "No space left on device" in line and "capture stopped" in line
    assert manifest(tmp_path / "snap")["capture_errors"] == [line.removeprefix("replay: capture: ")]
    assert len(Snapshot(tmp_path / "snap")) == 1  # the call before the failure


def test_strict_mode_raises_on_write_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REPLAY_CAPTURE_STRICT", "1")
    monkeypatch.setattr(writer, "write_atomic", failing_in(writer.SEGMENTS_DIR, writer.write_atomic))
    with replay.recording(tmp_path / "snap"):
        with pytest.raises(CaptureError, match="No space left on device"):
            takes_anything(torch.zeros(2))


def test_recording_into_an_existing_snapshot_is_refused(tmp_path: Path) -> None:
    with replay.recording(tmp_path / "snap"):
        pass
    with pytest.raises(SnapshotError, match="already holds a snapshot"):
        replay.recording(tmp_path / "snap").__enter__()
    assert recorder.active() is None


def test_weights_in_inference_mode_are_recorded(tmp_path: Path) -> None:
    with torch.inference_mode():
        weight = torch.randn(256, 128)
        with replay.recording(tmp_path / "snap") as rec:
            for _ in range(2):
                takes_anything(weight)
    assert not rec.stopped
    snapshot = Snapshot(tmp_path / "snap")
    assert len(snapshot) == 2 and len(list((tmp_path / "snap" / "blobs").iterdir())) == 1
    assert torch.equal(snapshot.load(1).tensors["in/x"], weight)


NOT_TENSORS = {"None": None, "float": 1.5, "list": [1, 2]}


@replay.capture("cap_tags_what_it_is_told")
def tags_told(x: torch.Tensor, what: str = "tensor") -> torch.Tensor:
    replay.tag("given", x if what == "tensor" else NOT_TENSORS[what])
    return x + 1


@pytest.mark.parametrize("what", NOT_TENSORS)
def test_tag_of_a_non_tensor_skips_that_call_only(what: str, tmp_path: Path, said) -> None:
    with replay.recording(tmp_path / "snap") as rec:
        before = tags_told(torch.zeros(2))
        results = [tags_told(torch.full((2,), 1.0), what) for _ in range(2)]
        after = tags_told(torch.full((2,), 2.0))
    assert torch.equal(before, torch.ones(2)) and torch.equal(after, torch.full((2,), 3.0))
    assert all(torch.equal(r, torch.full((2,), 2.0)) for r in results)  # the program went on
    assert not rec.stopped
    (line,) = stderr_capture_lines(said)
    assert line == (f"replay: capture: op 'cap_tags_what_it_is_told': tag 'given' is a value of type "
                    f"{type(NOT_TENSORS[what]).__name__}, not a tensor; call not recorded")
    assert manifest(tmp_path / "snap")["capture_errors"] == [line.removeprefix("replay: capture: ")]
    snapshot = Snapshot(tmp_path / "snap")
    assert [r.arguments()["what"] for r in snapshot] == ["tensor", "tensor"]
    assert [r.role("tag")["given"].tolist() for r in snapshot] == [[0.0, 0.0], [2.0, 2.0]]


def test_tag_of_a_non_tensor_raises_in_strict_mode(tmp_path: Path) -> None:
    with replay.recording(tmp_path / "snap", strict=True):
        with pytest.raises(CaptureError, match="tag 'given' is a value of type float, not a tensor"):
            tags_told(torch.zeros(2), "float")


def test_tag_of_a_non_tensor_outside_a_recording_or_in_a_replay_is_ignored() -> None:
    assert replay.tag("loose", None) is None and replay.tag("loose", [1]) == [1]
    assert torch.equal(tags_told(torch.zeros(2), "None"), torch.ones(2))
    with context.collecting() as sink:  # how replay runs a variant
        tags_told(torch.zeros(2), "float")
        replay.tag("kept", torch.ones(1))
    assert list(sink.tags) == ["kept"]


@replay.capture("cap_counts")
def counts(x: torch.Tensor, n: object) -> object:
    replay.record_launch("counts_kernel", (1,), n=n)
    return n


def test_integers_too_big_to_read_back_skip_that_call_only(tmp_path: Path, said) -> None:
    fine = [2**63 - 1, -(2**63), 2**70]
    # 10**5000 is past what Python's json reads (4300 digits) and even prints
    too_big = [2**2000, 2**2000, [1, -(2**3000)], 10**5000]
    with replay.recording(tmp_path / "snap") as rec:
        counts(torch.zeros(1), fine[0])
        returned = [counts(torch.zeros(1), n) for n in too_big]
        counts(torch.zeros(1), fine[1])
        counts(torch.zeros(1), fine[2])
    assert returned == too_big  # the program went on
    assert not rec.stopped
    lines = stderr_capture_lines(said)
    assert len(lines) == 3  # 2**2000 twice: reported once
    assert all(line.startswith("replay: capture: op 'cap_counts': argument 'n' is neither a tensor nor "
                               "JSON-representable: ") and line.endswith("; call not recorded") for line in lines)
    assert manifest(tmp_path / "snap")["capture_errors"] == [line.removeprefix("replay: capture: ") for line in lines]
    snapshot = Snapshot(tmp_path / "snap")
    assert [r.arguments()["n"] for r in snapshot] == fine
    assert [r.returns_json["out"] for r in snapshot] == fine
    assert [r.launch[0]["n"] for r in snapshot] == fine


def test_integer_too_big_raises_in_strict_mode(tmp_path: Path) -> None:
    with replay.recording(tmp_path / "snap", strict=True):
        with pytest.raises(CaptureError, match="op 'cap_counts': argument 'n' is neither a tensor nor JSON"):
            counts(torch.zeros(1), 2**2000)


def test_integer_too_big_in_an_output_or_a_launch_record(tmp_path: Path,
                                                                  said) -> None:
    @replay.capture("cap_returns_big")
    def returns_big(x: torch.Tensor) -> int:
        replay.record_launch("big_kernel", (1,), size=2**2000, huge=10**5000)
        return 2**2000

    @replay.capture("cap_launches_big")
    def launches_big(x: torch.Tensor) -> torch.Tensor:
        replay.record_launch("big_kernel", (1,), size=2**2000, huge=10**5000)
        return x

    with replay.recording(tmp_path / "snap"):
        assert returns_big(torch.zeros(1)) == 2**2000
        launches_big(torch.zeros(1))
    (line,) = stderr_capture_lines(said)
    assert line.startswith("replay: capture: op 'cap_returns_big': output 'out' is neither a tensor nor JSON")
    (record,) = Snapshot(tmp_path / "snap")
    assert record.op == "cap_launches_big"  # launch records are informational: kept as text
    assert record.launch[0]["size"] == str(2**2000) and record.launch[0]["huge"] == "<int>"


@replay.capture("cap_hands_views", state=("position_buf",))
def hands_views(x: torch.Tensor, position_buf: torch.Tensor) -> torch.Tensor:
    scratch = torch.zeros(2)
    replay.record_launch("views_kernel", (1,), pointers={"x_ptr": x, "pos_ptr": position_buf[1:],
                                                         "scratch_ptr": scratch})
    return x + 1


def test_a_launch_names_the_call_argument_each_pointer_points_into(tmp_path: Path) -> None:
    with replay.recording(tmp_path / "snap"):
        hands_views(torch.zeros(3), torch.arange(4, dtype=torch.int32))
    (launch,) = Snapshot(tmp_path / "snap").load(0).launch
    # a view into position_buf is position_buf; a tensor made inside the call is no argument
    assert launch["binds"] == {"x_ptr": "x", "pos_ptr": "position_buf"}
    with context.collecting(arguments={"buf": (buf := torch.zeros(8))}) as sink:  # how a replay names them
        replay.record_launch("k", (1,), pointers={"p": buf[4:]})
    assert sink.launches[0]["binds"] == {"p": "buf"}


def test_the_wrapper_takes_every_kind_of_parameter_as_the_function_does(tmp_path: Path) -> None:
    # compiled with the function's own parameters (the fast path with no recording active)
    def every_kind(x, y=2, /, z=3, *rest, k, m=4, **more):  # noqa: ANN001, ANN002, ANN003, ANN202
        return x + y + z + sum(rest) + k + m + sum(more.values())

    captured = replay.capture("every_kind")(every_kind)
    assert inspect.signature(captured) == inspect.signature(every_kind)
    calls = [((1,), {"k": 10}), ((1, 2, 3, 4, 5), {"k": 10, "m": 0, "extra": 100})]
    for args, kwargs in calls:
        assert captured(*args, **kwargs) == every_kind(*args, **kwargs)
    with pytest.raises(TypeError) as own:
        every_kind(1)
    with pytest.raises(TypeError) as wrapped:
        captured(1)
    assert str(wrapped.value) == str(own.value) and "every_kind() missing 1 required keyword-only" in str(own.value)
    with replay.recording(tmp_path / "snap"):
        for args, kwargs in calls:
            captured(*args, **kwargs)
    recorded = [record.arguments() for record in Snapshot(tmp_path / "snap")]
    assert recorded[1] == {"x": 1, "y": 2, "z": 3, "rest": (4, 5), "k": 10, "m": 0, "more": {"extra": 100}}


def test_callables_that_are_not_plain_functions_keep_their_own_calling_convention() -> None:
    import functools

    def base(x, y=1, **options):  # noqa: ANN001, ANN003, ANN202
        return x + y + sum(options.values())

    @functools.wraps(base)
    def decorated(x, **options):  # noqa: ANN001, ANN003, ANN202 (its signature reads as base's)
        return base(x, **options)

    class Scale:
        def __call__(self, x: int) -> int:
            return 2 * x

    assert replay.capture("kinds_decorated")(decorated)(1, stream=5) == 7  # not base's (x, y=1) alone
    assert replay.capture("kinds_partial")(functools.partial(base, y=10))(1) == 11
    assert replay.capture("kinds_object")(Scale())(4) == 8


def test_a_segment_that_cannot_be_written_never_reaches_the_program(tmp_path: Path,
                                                                     said) -> None:
    weight = torch.randn(128, 128)  # a blob, written before the call's segment
    with replay.recording(tmp_path / "snap") as rec:
        (tmp_path / "snap" / "segments").rmdir()
        (tmp_path / "snap" / "segments").write_text("in the way")
        takes_anything(weight)
    assert rec.stopped and "writing call 0 failed" in "\n".join(said())


def test_the_manifest_names_the_commit_it_was_recorded_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # read on a thread while the recording starts, so that no call waits for git: there at close
    import git
    repo = git.Repo.init(tmp_path / "project")
    (tmp_path / "project" / "a.txt").write_text("a")
    repo.index.add(["a.txt"])
    commit = repo.index.commit("first").hexsha
    monkeypatch.chdir(tmp_path / "project")
    with replay.recording(tmp_path / "snap"):
        scale_(torch.ones(3), 2.0)
    manifest = json.loads((tmp_path / "snap" / "manifest.json").read_text())
    assert manifest["producer"]["git"] == {"commit": commit, "dirty": False}
