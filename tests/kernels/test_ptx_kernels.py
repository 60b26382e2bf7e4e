"""`replay ptx` on the project's own kernels, compiled for sm_80, sm_89 and sm_90 without a GPU: every
op's variants on its registered examples, and the kernels a recording ran; with the ops' rules."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from click.testing import CliRunner

import kernel_cases
import replay_kernels
import replay
from replay_kernels import bugs
from replay.cli import main
from replay.registry import get_op

ARCHS = ("sm_80", "sm_89", "sm_90")


def ptx_json(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, ["ptx", *args, "--json", "-"])
    assert result.stdout.strip(), result.output
    return result.exit_code, json.loads(result.stdout)


def test_every_op_passes_its_rules_on_every_target_with_batched_and_single_side_by_side() -> None:
    code, report = ptx_json("--arch", ",".join(ARCHS), "--dtype", "float32")
    assert code == 0, [k["violations"] for k in report["kernels"] if k["violations"]]
    seen = {(k["op"], k["variant"], k["arch"]) for k in report["kernels"]}
    with_kernels = {*replay_kernels.OPS, "det_gemm"}  # torch_matmul launches no Triton kernel
    assert seen == {(op, variant, arch) for op in with_kernels for variant in ("single", "batched") for arch in ARCHS}
    assert all(k["registers"] and k["registers"] > 0 for k in report["kernels"])  # read from each cubin
    gemv = [k for k in report["kernels"] if k["op"] == "q4k_gemv" and k["arch"] == "sm_90"]
    assert all(k["axes_read"] == ["x", "y"] for k in gemv)  # weight rows on x, activation rows on y
    # the GEMV's single and batched launches differ in the rows a program takes, and the report says so
    pair = next(p for p in report["pairs"] if p["op"] == "q4k_gemv" and p["arch"] == "sm_90")
    assert pair["differences"]["constexprs"]["single"]["BLOCK_M"] == 1
    assert pair["differences"]["constexprs"]["batched"]["BLOCK_M"] > 1
    scatter = {k["example"]: k["arguments_read"] for k in report["kernels"]
               if k["op"] == "kv_scatter" and k["variant"] == "batched" and k["arch"] == "sm_90"}
    assert "positions" in scatter["paged"] and "position_buf" not in scatter["paged"]
    assert "position_buf" in scatter["indirect"] and "positions" not in scatter["indirect"]


def test_a_scatter_that_reads_position_buf_when_handed_positions_is_caught() -> None:
    with bugs.planting("kv_scatter_stale_position_buf"):
        code, report = ptx_json("kv_scatter", "--arch", "sm_90", "--dtype", "float32")
    assert code == 1
    caught = {(k["variant"], k["example"]): [v["message"] for v in k["violations"]] for k in report["kernels"]}
    message = "reads position_buf (through src_pos_ptr) although the call gives positions"
    assert caught[("batched", "paged")] == [message] and caught[("batched", "contiguous")] == [message]
    # the real single variant, and the indirect call that gives no positions, keep the rule
    assert caught[("single", "paged")] == [] and caught[("batched", "indirect")] == []


def test_the_kernels_a_snapshot_ran_compile_again_for_each_target_and_pass(tmp_path: Path, dev: str) -> None:
    with replay.recording(tmp_path / "snap"):
        for op in ("kv_scatter", "rmsnorm", "attention"):
            get_op(op).get("batched")(**kernel_cases.make(op, 2, torch.float32, dev))
    code, report = ptx_json("--snapshot", str(tmp_path / "snap"), "--arch", ",".join(ARCHS))
    assert code == 0, report
    kernels_seen = report["kernels"]
    assert sorted((k["name"], k["arch"]) for k in kernels_seen) == sorted(
        (name, arch) for name in ("_kv_scatter_kernel", "_rmsnorm_rows_kernel", "_attention_row_kernel")
        for arch in ARCHS)
    scatter = next(k for k in kernels_seen if k["name"] == "_kv_scatter_kernel")
    # named as the kernel and the call name them: the positions it was handed, never a grid axis but x
    assert "src_pos_ptr" in scatter["params_read"] and "written_ptr" in scatter["params_written"]
    assert scatter["binds"]["src_pos_ptr"] == "positions" and "positions" in scatter["arguments_read"]
    assert scatter["axes_read"] == ["x"] and scatter["op"] == "kv_scatter" and scatter["variant"] == "batched"
