"""`replay ptx --snapshot`: the project's own kernels, as a recording ran them, compiled again for sm_80,
sm_89 and sm_90 without a GPU, and checked."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from click.testing import CliRunner

import kernel_cases
import replay
from replay.cli import main
from replay.registry import get_op


def test_the_kernels_a_snapshot_ran_compile_again_for_each_target_and_pass(tmp_path: Path, dev: str) -> None:
    with replay.recording(tmp_path / "snap"):
        for op in ("kv_scatter", "rmsnorm", "attention"):
            get_op(op).get("batched")(**kernel_cases.make(op, 2, torch.float32, dev))
    result = CliRunner().invoke(main, ["ptx", "--snapshot", str(tmp_path / "snap"), "--arch", "sm_80,sm_89,sm_90",
                                       "--json", "-"])
    assert result.exit_code == 0, result.output
    kernels = json.loads(result.stdout)["kernels"]
    assert sorted((k["name"], k["file"].rsplit("sm_", 1)[1]) for k in kernels) == sorted(
        (name, arch) for name in ("_kv_scatter_kernel", "_rmsnorm_rows_kernel", "_attention_row_kernel")
        for arch in ("80", "89", "90"))
    scatter = next(k for k in kernels if k["name"] == "_kv_scatter_kernel")
    # named as the kernel names them: it reads the positions it was handed (src_pos_ptr), never a grid axis but x
    assert "src_pos_ptr" in scatter["params_read"] and "written_ptr" in scatter["params_written"]
    assert scatter["axes_read"] == ["x"] and all(not k["violations"] for k in kernels)
