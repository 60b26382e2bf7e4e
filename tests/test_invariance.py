"""`replay invariance`: a row's output is the same alone, in batches of every size at every position,
in chunks and with padding, for the project's kernels; a variant that switches its reduction with the
batch size, and torch.matmul under cuBLAS, are caught."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

import pytest
import torch
from click.testing import CliRunner

import replay_kernels  # noqa: F401 (registers the ops)
import replay
from replay import registry
from replay.cli import main
from replay.registry import get_op


def invariance(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["invariance", *args, "--json", "-"])
    assert result.stdout.strip(), result.output
    return result.exit_code, json.loads(result.stdout)


def verdicts(report: dict) -> dict[tuple[str, int], bool]:
    return {(r["property"], r["size"]): r["passed"] for op in report["ops"] for r in op["results"]}


def test_the_row_kernels_are_batch_invariant_and_a_cache_writer_is_not_applicable() -> None:
    code, report = invariance("rmsnorm", "q4k_gemv", "--batch-sizes", "1,2,5", "--chunks", "2", "--pad", "3")
    assert code == 0, report
    assert set(verdicts(report)) == {("batch", 1), ("batch", 2), ("batch", 5), ("chunks", 2), ("padding", 3)}
    assert all(verdicts(report).values())
    code, scatter = invariance("kv_scatter", "--batch-sizes", "2", "--example", "paged")
    assert code == 0 and scatter["ops"][0]["skipped"].startswith("its rows share state")


def rmsnorm_switching_with_batch(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """An rmsnorm that, like a library picking its kernel by M, rounds differently past two rows (it
    multiplies the scale into the weight first there)."""
    x32, w32 = x.float(), weight.float()
    scale = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    out = x32 * scale * w32 if x.shape[0] <= 2 else x32 * (scale * w32)
    return out.to(x.dtype)


def test_a_variant_that_switches_its_reduction_with_the_batch_is_caught() -> None:
    with get_op("rmsnorm").replacing("batched", rmsnorm_switching_with_batch):
        code, report = invariance("rmsnorm", "--batch-sizes", "1,2,3", "--chunks", "4", "--pad", "2")
    assert code == 1
    found = verdicts(report)
    assert found[("batch", 1)] and found[("batch", 2)]
    assert not found[("batch", 3)] and not found[("chunks", 4)] and not found[("padding", 2)]
    three = next(r for r in report["ops"][0]["results"] if r["property"] == "batch" and r["size"] == 3)
    assert three["rows_changed"] and three["max_ulp"] > 0 and "ulp" in three["first"]


@pytest.mark.gpu
def test_torch_matmul_under_cublas_is_caught() -> None:
    code, report = invariance("torch_matmul", "--batch-sizes", "1,16,17,64", "--chunks", "16", "--pad", "5",
                              "--dtype", "bfloat16", "--device", "cuda")
    passed = verdicts(report)
    assert code == 1 and passed[("batch", 1)]
    # which sizes change cuBLAS's bits is its choice of kernel on each GPU (H100: 17, 64 and padding;
    # H200: fewer): some do, and each says by how many rows and ulps
    differing = [r for r in report["ops"][0]["results"] if not r["passed"]]
    assert differing and all(r["rows_changed"] and r["max_ulp"] > 0 for r in differing)


@pytest.mark.parametrize("option, value", [("--batch-sizes", "0"), ("--chunks", "x"), ("--pad", ",")])
def test_bad_sizes_are_exit_2(option: str, value: str) -> None:
    result = CliRunner().invoke(main, ["invariance", "rmsnorm", option, value])
    assert result.exit_code == 2 and option in result.stderr


def test_recorded_calls_are_checked_on_their_own_rows() -> None:
    shipped = str(Path(__file__).resolve().parents[1] / "snapshots" / "prefill_001")
    args = ("--snapshot", shipped, "rmsnorm", "--call", "0", "--batch-sizes", "1,3", "--chunks", "3", "--pad", "2")
    code, report = invariance(*args)
    assert code == 0 and [op["example"] for op in report["ops"]] == ["call 0"] and all(verdicts(report).values())
    with get_op("rmsnorm").replacing("batched", rmsnorm_switching_with_batch):
        code, report = invariance(*args)
    assert code == 1 and not verdicts(report)[("batch", 3)] and verdicts(report)[("batch", 1)]


def _rotate(x: torch.Tensor, position_buf: torch.Tensor) -> torch.Tensor:
    return (x.double() * torch.cos(position_buf.double())[:, None]).to(x.dtype)


def _causal_softmax(scores: torch.Tensor, kv_cache_lengths: torch.Tensor) -> torch.Tensor:
    keys = torch.arange(scores.shape[1], device=scores.device)[None, :]
    return torch.softmax(scores.masked_fill(keys >= kv_cache_lengths[:, None], float("-inf")), dim=-1)


def _per_row(*names: str):
    """split_row for ops whose per-row state is no batch-axis argument: each row takes its own entry."""
    return lambda args, r: {k: v[r:r + 1] if k in names else v for k, v in args.items()}


@pytest.fixture
def split_row_ops() -> Iterator[None]:
    """Two ops whose single calls cut per-row state by split_row, registered for the test only (a
    command run with no op named takes every op with examples)."""
    saved = dict(registry._OPS)
    rope = replay.op("inv_rope_split_row", batch_axes={"x": 0, "out": 0}, split_row=_per_row("x", "position_buf"))
    rope.batched(_rotate)
    rope.example()(lambda rows, dtype, device: {"x": torch.randn(rows, 8, dtype=dtype, device=device),
                                                "position_buf": torch.arange(rows, device=device) + 5})
    softmax = replay.op("inv_causal_softmax", batch_axes={"scores": 0, "out": 0},
                        split_row=_per_row("scores", "kv_cache_lengths"))
    softmax.batched(_causal_softmax)
    softmax.example()(lambda rows, dtype, device: {"scores": torch.randn(rows, 16, dtype=dtype, device=device),
                                                   "kv_cache_lengths": torch.arange(rows, device=device) % 16 + 1})
    yield
    registry._OPS.clear()
    registry._OPS.update(saved)


def test_rows_are_cut_as_single_cuts_them_so_per_row_state_is_no_false_alarm(split_row_ops: None) -> None:
    code, report = invariance("inv_rope_split_row", "inv_causal_softmax", "--batch-sizes", "1,3,8", "--chunks", "3",
                              "--pad", "2")
    assert code == 0, report
    assert len(verdicts(report)) == 5 and all(verdicts(report).values())


@pytest.fixture
def no_batch_axis() -> Iterator[object]:
    """An op declared with no batch axis, for the test only."""
    saved = dict(registry._OPS)
    yield replay.capture("inv_no_batch_axis")(lambda x: x.sum())
    registry._OPS.clear()
    registry._OPS.update(saved)


def test_a_recorded_op_with_no_batch_axis_is_not_applicable(tmp_path: Path, device: str, no_batch_axis) -> None:
    with replay.recording(tmp_path / "snap"):
        no_batch_axis(torch.ones(4, device=device))
        get_op("rmsnorm").variants["batched"](torch.randn(3, 32, device=device), torch.ones(32, device=device), 1e-6)
    code, report = invariance("--snapshot", str(tmp_path / "snap"), "--batch-sizes", "1,3", "--chunks", "3",
                              "--pad", "1", "--provider", __name__)
    assert code == 0, report
    skipped = {op["op"]: op["skipped"] for op in report["ops"]}
    assert skipped == {"inv_no_batch_axis": "it declares no batch axis: batch invariance is about rows", "rmsnorm": None}


def test_a_variant_failing_on_its_example_is_one_line_naming_it(split_row_ops: None) -> None:
    with get_op("inv_causal_softmax").replacing("batched", lambda scores, kv_cache_lengths: scores[99]):
        result = CliRunner().invoke(main, ["invariance", "inv_causal_softmax"])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("replay: error: op 'inv_causal_softmax' batched, example 'default' on ")
    assert "IndexError" in result.stderr and len(result.stderr.strip().splitlines()) == 1
