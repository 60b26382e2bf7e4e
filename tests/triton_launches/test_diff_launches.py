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
