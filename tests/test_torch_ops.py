"""PyTorch operator calls recorded unchanged (`replay record --torch-ops`): aten and torch.library
custom ops rerun by their overload names and against float64 on the CPU; a custom op wrong in
float32 (tests/torch_ops_project/rowlib.py) is named by call, op and rows; views and in-place
operators round-trip."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from user_shell import shell

PROJECT = Path(__file__).resolve().parent / "torch_ops_project"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("torchops")
    for name in ("rowlib.py", "prog.py"):
        shutil.copy(PROJECT / name, where / name)
    done = shell("replay record --torch-ops -- python prog.py", where)
    assert done.returncode == 0, done.stderr
    alone = shell("python prog.py", where)
    assert alone.stdout == done.stdout  # the program's output, untouched by recording
    return where


def replayed(where: Path, *options: str) -> tuple[int, dict]:
    done = shell(f"replay run snapshots/prog_001 --provider rowlib --json - {' '.join(options)}", where)
    return done.returncode, json.loads(done.stdout)


def test_each_operator_call_is_recorded_views_and_factories_not(recorded: Path) -> None:
    calls = json.loads(shell("replay show snapshots/prog_001 --json -", recorded).stdout)["calls"]
    assert [c["op"] for c in calls] == ["rowlib.rowscale.default", "aten.mul_.Tensor", "aten.cat.default",
                                        "aten.sum.dim_IntList"]  # no view, t, arange or tensor()
    mul = calls[1]
    view = next(t for t in mul["tensors"] if t["role"] == "in" and t["name"] == "self")
    assert view["shape"] == [4, 2] and view["stride"] == [6, 1]  # the view, as it was
    assert ("out", "self") in {(t["role"], t["name"]) for t in mul["tensors"]}  # what it wrote, after


def test_a_custom_op_wrong_in_float32_is_named_by_call_op_and_rows(recorded: Path) -> None:
    code, report = replayed(recorded)
    assert code == 1
    (failing,) = [c for c in report["calls"] if not c["passed"]]
    assert (failing["index"], failing["op"]) == (0, "rowlib.rowscale.default")
    (check,) = [c for c in failing["checks"] if not c["passed"]]
    assert (check["kind"], check["name"], check["comparison"]["bad_rows"]) == ("vs-reference", "out", [2])
    assert all(c["passed"] for c in failing["checks"] if c["kind"] == "vs-recorded")  # it does what it did


def test_views_and_in_place_operators_round_trip(recorded: Path) -> None:
    code, report = replayed(recorded, "--op aten.mul_.Tensor --op aten.cat.default --op aten.sum.dim_IntList")
    assert code == 0 and [c["op"] for c in report["calls"]] == ["aten.mul_.Tensor", "aten.cat.default",
                                                                "aten.sum.dim_IntList"]


def test_a_custom_op_whose_library_is_not_loaded_is_untestable(recorded: Path, tmp_path: Path) -> None:
    done = shell(f"replay run {recorded / 'snapshots' / 'prog_001'} --op rowlib.rowscale.default", tmp_path)
    assert done.returncode == 2 and "provider module 'rowlib' is not trusted" in done.stderr


def test_stopped_from_another_thread_the_operator_recording_records_nothing_more(tmp_path: Path) -> None:
    import threading

    import torch

    from replay.recorder.lifecycle import start, stop
    from replay.recorder.options import RecordingOptions
    from replay.snapshot import Snapshot

    x = torch.ones(3)
    mode = start(tmp_path / "snap", RecordingOptions(torch_ops=True, triton=False)).torch_ops
    x + 1
    stopper = threading.Thread(target=stop)
    stopper.start()
    stopper.join()
    try:
        x * 2  # after the stop, on the thread whose dispatch stack still holds the mode
        assert [call.op for call in Snapshot(tmp_path / "snap")] == ["aten.add.Tensor"]
    finally:
        mode.__exit__(None, None, None)  # what the program's thread is left to do (torch.compile minds it)


def test_a_launch_let_pass_runs_no_operator_into_the_recording(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import replay
    from replay.snapshot import Snapshot

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "triton_launches"))
    from writes_cases import plain

    x = torch.ones(16, device="cuda" if torch.cuda.is_available() else "cpu")
    out = torch.empty_like(x)
    with replay.recording(tmp_path / "snap", torch_ops=True, only=("no_such_kernel",)):
        plain[(1,)](x, out, 16, BLOCK=16)  # the interpreter copies tensors with torch operators
    assert len(Snapshot(tmp_path / "snap")) == 0


def test_diff_does_not_compare_what_an_out_buffer_held_before(tmp_path: Path) -> None:
    import torch
    from click.testing import CliRunner

    import replay
    from replay.cli import main

    x = torch.arange(4.0)
    for name, leftover in (("a", 7.0), ("b", 9.0)):  # two runs, two different leftovers in the buffer
        buffer = torch.full((4,), leftover)
        with replay.recording(tmp_path / name, torch_ops=True, triton=False):
            torch.add(x, 1, out=buffer)
    result = CliRunner().invoke(main, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json", "-"])
    assert result.exit_code == 0 and json.loads(result.stdout)["calls_compared"] == 1, result.output
