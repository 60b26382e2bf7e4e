"""`replay diff` on two recordings of Triton launches pairs each kernel's launches by ordinal, so
recordings whose launches interleave differently (another batch size, another commit) still
compare the same launch, and names the first launch, argument and rows that differ."""
from __future__ import annotations

import json
from pathlib import Path

import torch
import triton.language as tl
from click.testing import CliRunner

import replay
from replay.cli import main

import door_kernels as k

CAST = "door_kernels.cast_kernel"


def record(path: Path, device: str, steps: list[str], x: torch.Tensor) -> None:
    """Launch the kernels named in `steps`, in that order, on `x` (8 rows of 4)."""
    with replay.recording(path):
        for step in steps:
            if step == "double":
                k.double(x.flatten())
            else:
                k.cast_kernel[(2,)](x, torch.empty_like(x), x.numel(), OUT_DTYPE=tl.float32, BLOCK=16)


def diff(a: Path, b: Path) -> tuple[int, dict, str]:
    as_json = CliRunner().invoke(main, ["diff", str(a), str(b), "--json", "-"])
    shown = CliRunner().invoke(main, ["diff", str(a), str(b)])
    return as_json.exit_code, json.loads(as_json.stdout), " ".join(shown.output.split())


def test_launches_are_paired_by_kernel_and_ordinal(tmp_path: Path, device: str) -> None:
    x = torch.arange(32.0, device=device).view(8, 4)
    changed = x.clone()
    changed[5, 2] += 1  # one element of row 5
    record(tmp_path / "a", device, ["double", "cast", "double", "cast"], x)
    record(tmp_path / "b", device, ["cast", "double", "cast", "double", "double"], x)
    code, report, _ = diff(tmp_path / "a", tmp_path / "b")
    assert code == 1 and report["calls"] == []  # every launch A has is the same in B, though in another order
    assert report["structural"] == ["A has 4 calls, B has 5", "op 'writes_cases.plain': 2 calls in A, 3 in B"]

    record(tmp_path / "c", device, ["cast", "double", "cast"], x)
    with replay.recording(tmp_path / "d"):  # the second cast reads the changed tensor
        k.cast_kernel[(2,)](x, torch.empty_like(x), 32, OUT_DTYPE=tl.float32, BLOCK=16)
        k.double(x.flatten())
        k.cast_kernel[(2,)](changed, torch.empty_like(x), 32, OUT_DTYPE=tl.float32, BLOCK=16)
    code, report, shown = diff(tmp_path / "c", tmp_path / "d")
    first = report["first_divergence"]
    assert code == 1 and (first["op"], first["ordinal"], first["position"], first["tensor"]) == (CAST, 1, 2, "in/x_ptr")
    assert first["comparison"]["bad_rows"] == [5]
    assert f"first divergence: call #2 ({CAST}, its call 1), in/x_ptr: 1/32 elements" in shown and "rows 5" in shown
    assert "first at [5, 2]: A 22.0 vs B 23.0" in shown  # each value named by its snapshot, A's first


def test_a_batch_of_one_against_one_of_eight_compares_the_rows_both_hold(tmp_path: Path, device: str) -> None:
    x = torch.arange(32.0, device=device).view(8, 4)

    def record_rows(path: Path, rows: int, n: int) -> None:
        with replay.recording(path):
            k.cast_kernel[(2,)](x[:rows], torch.zeros_like(x[:rows]), n, OUT_DTYPE=tl.float32, BLOCK=16)
            k.double(x[:rows].flatten())

    record_rows(tmp_path / "one", 1, 4)
    record_rows(tmp_path / "eight", 8, 32)
    code, report, shown = diff(tmp_path / "one", tmp_path / "eight")
    first = report["first_divergence"]
    assert code == 1 and all(call["knock_on"] for call in report["calls"])  # sizes alone differ
    assert (first["position"], first["tensor"], first["row_counts"], first["rows_only"]) == (0, "in/x_ptr", [1, 8], True)
    assert "in/x_ptr: A has 1 rows, B 8; the 1 both hold agree" in shown

    record_rows(tmp_path / "short", 8, 3)  # leaves row 0's last element as torch.zeros made it
    code, report, shown = diff(tmp_path / "one", tmp_path / "short")
    first = report["first_divergence"]
    assert code == 1 and not report["calls"][0]["knock_on"]  # its own: the scalar n is the batch's size
    assert (first["position"], first["tensor"], first["row_counts"]) == (0, "out/out_ptr", [1, 8])
    assert first["comparison"]["bad_rows"] == [0] and first["comparison"]["first_index"] == [0, 3]
    assert "out/out_ptr: A has 1 rows, B 8; the 1 both hold differ: 1/4 elements" in shown


def test_an_input_of_one_shape_that_differs_beside_a_batch_of_another_size_is_carried_in(tmp_path: Path,
                                                                                         device: str) -> None:
    x = torch.arange(32.0, device=device).view(8, 4)
    w = torch.ones(4, device=device)

    def record_rows(path: Path, rows: int, weight: torch.Tensor) -> None:
        with replay.recording(path):
            k.scaled_rows_kernel[(rows,)](x[:rows], weight, torch.empty_like(x[:rows]), 4, BLOCK=4)

    record_rows(tmp_path / "one", 1, w)
    record_rows(tmp_path / "eight", 8, w * 2)  # the weight differs: every row's output follows it
    code, report, shown = diff(tmp_path / "one", tmp_path / "eight")
    first = report["first_divergence"]
    assert code == 1 and report["calls"][0]["knock_on"]  # what differs came in with the weight
    assert first["tensor"] == "in/w_ptr" and first["comparison"]["mismatches"] == 4
