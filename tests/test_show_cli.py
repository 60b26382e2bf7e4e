"""`replay show`: the table, --json, the filters and --export."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner, Result

import replay
from fixtures.make_fixture_snapshot import make_fixture_snapshot
from replay.cli import main
from replay.summary import tensor_stats

REPLAY = Path(sys.executable).with_name("replay")


@replay.capture("show_mixed")
def mixed(values: torch.Tensor, counts: torch.Tensor, mask: torch.Tensor, half: torch.Tensor,
          fp8: torch.Tensor, empty: torch.Tensor, scale: float = 0.5) -> torch.Tensor:
    replay.tag("odd/name", values * scale)
    return values.nan_to_num(posinf=0.0, neginf=0.0)


@pytest.fixture(scope="module")
def fixture_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fixture_snapshot(tmp_path_factory.mktemp("fixture") / "snap")


@pytest.fixture(scope="module")
def mixed_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mixed") / "snap"
    with replay.recording(path):
        mixed(torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 3.0, 2.0]),
              torch.tensor([[-5, 7], [2, 0]], dtype=torch.int64).t(),
              torch.tensor([True, False, True]),
              torch.tensor([0.5, -1.25, 8.0], dtype=torch.bfloat16),
              torch.tensor([0.5, -2.0]).to(torch.float8_e4m3fn),
              torch.zeros(0, 4))
    return path


def invoke(*args: str) -> Result:
    result = CliRunner().invoke(main, ["show", *(str(a) for a in args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def shown_json(*args: str) -> dict:
    result = invoke(*args, "--json", "-")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def rows(data: dict) -> dict[tuple[int, str, str], dict]:
    return {(c["index"], t["role"], t["name"]): t for c in data["calls"] for t in c["tensors"]}


def test_table_lists_every_call_and_tensor(fixture_snapshot: Path) -> None:
    result = invoke(fixture_snapshot)
    assert result.exit_code == 0, result.stderr
    for text in ("fixture_rmsnorm", "fixture_linear", "fixture_kv_append", "position_buf", "weight_t",
                 "float32*", "stored once by content (blobs/, packs/)", "(1, 64)", "(64, 1) +64", "eps=1e-06", "6 of 6 calls", "format 6"):
        assert text in result.stdout, text


def test_json_has_geometry_and_statistics(mixed_snapshot: Path) -> None:
    data = shown_json(mixed_snapshot)
    (call,) = data["calls"]
    assert (call["op"], call["variant"], call["args"]) == ("show_mixed", "default", {"scale": 0.5})
    t = rows(data)
    values = t[(0, "in", "values")]
    assert (values["nan"], values["inf"], values["min"], values["max"], values["mean"]) == (1, 2, 1.0, 3.0, 2.0)
    counts = t[(0, "in", "counts")]
    assert (counts["stride"], counts["min"], counts["max"], counts["mean"]) == ([1, 2], -5, 7, 1.0)
    assert (t[(0, "in", "mask")]["min"], t[(0, "in", "mask")]["max"]) == (0, 1)
    assert (t[(0, "in", "half")]["dtype"], t[(0, "in", "half")]["min"]) == ("bfloat16", -1.25)
    assert (t[(0, "in", "fp8")]["dtype"], t[(0, "in", "fp8")]["mean"]) == ("float8_e4m3fn", -0.75)
    empty = t[(0, "in", "empty")]
    assert (empty["shape"], empty["numel"], empty["min"], empty["mean"]) == ([0, 4], 0, None, None)
    assert t[(0, "tag", "odd/name")]["max"] == 1.5


def test_statistics_cover_the_view_not_its_storage() -> None:
    storage = torch.arange(10.0)
    stats = tensor_stats(storage[2:8:3])  # elements 2 and 5 only
    assert (stats["min"], stats["max"], stats["mean"], stats["numel"]) == (2.0, 5.0, 3.5, 2)
    assert tensor_stats(torch.tensor([2 ** 64 - 1, 0], dtype=torch.uint64))["max"] == 2 ** 64 - 1


def test_filters_choose_calls_ops_and_roles(fixture_snapshot: Path) -> None:
    assert [c["index"] for c in shown_json(fixture_snapshot, "--call", "4", "--call", "1")["calls"]] == [4, 1]
    assert {c["op"] for c in shown_json(fixture_snapshot, "--op", "fixture_linear")["calls"]} == {"fixture_linear"}
    only_state = shown_json(fixture_snapshot, "--op", "fixture_kv_append", "--role", "state")
    assert {(t["role"], t["name"]) for c in only_state["calls"] for t in c["tensors"]} == {("state", "position_buf")}


@pytest.mark.parametrize("args, message", [(["--call", "99"], "no call with index 99"),
                                           (["--op", "nope"], "no calls of op 'nope'")])
def test_unknown_selection_is_exit_2_one_line(fixture_snapshot: Path, args: list[str], message: str) -> None:
    result = invoke(fixture_snapshot, *args)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr


def test_export_writes_npy_with_bf16_as_float32(mixed_snapshot: Path, tmp_path: Path) -> None:
    result = invoke(mixed_snapshot, "--export", tmp_path / "out")
    assert result.exit_code == 0, result.stderr
    assert "written as float32" in result.stdout
    files = {p.name: np.load(p, allow_pickle=False) for p in (tmp_path / "out").iterdir()}
    assert sorted(files) == sorted(f"000000-show_mixed-{n}.npy" for n in (
        "in-values", "in-counts", "in-mask", "in-half", "in-fp8", "in-empty", "out-out", "tag-odd_name"))
    half = files["000000-show_mixed-in-half.npy"]
    assert half.dtype == np.float32 and half.tolist() == [0.5, -1.25, 8.0]
    fp8 = files["000000-show_mixed-in-fp8.npy"]
    assert fp8.dtype == np.float32 and fp8.tolist() == [0.5, -2.0]
    counts = files["000000-show_mixed-in-counts.npy"]
    assert counts.dtype == np.int64 and counts.tolist() == [[-5, 2], [7, 0]]  # the view, transposed
    assert files["000000-show_mixed-in-mask.npy"].dtype == np.bool_
    assert files["000000-show_mixed-in-empty.npy"].shape == (0, 4)


def test_export_is_reported_in_json(mixed_snapshot: Path, tmp_path: Path) -> None:
    t = rows(shown_json(mixed_snapshot, "--role", "in", "--export", str(tmp_path / "out")))
    assert (t[(0, "in", "half")]["exported_dtype"], t[(0, "in", "values")]["exported_dtype"]) == ("float32", "float32")
    assert Path(t[(0, "in", "counts")]["exported"]).is_file()


def test_help_has_an_example() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    assert "replay show snapshots/prefill_001 --call 17 --export" in result.stdout


@pytest.mark.skipif(not REPLAY.exists(), reason="the console script exists only where the project is pip-installed "
                                               "(CI installs it; the GPU image runs from the source tree)")
def test_console_script_shows_the_fixture(fixture_snapshot: Path) -> None:
    done = subprocess.run([str(REPLAY), "show", str(fixture_snapshot), "--op", "fixture_rmsnorm"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "fixture_rmsnorm" in done.stdout and "fixture_linear" not in done.stdout
