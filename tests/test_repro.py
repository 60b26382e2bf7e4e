"""`replay repro`: a recorded call as a directory that reproduces it in a virtual environment
without kernel-replay: exit 0 on a clean call, 1 where the kernel's code diverges."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from click.testing import CliRunner

import pytest

from kernel_copies import RMSNORM_MEAN_OVER_H_PLUS_1, edited_kernels
from replay.cli import main as cli_main

pytestmark = pytest.mark.usefixtures("restore_kernels")

ROOT = Path(__file__).parent.parent
SHIPPED = ROOT / "snapshots" / "prefill_001"


def _run(python: Path, directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(python), str(directory / "repro.py")], capture_output=True, text=True,
                          cwd=directory.parent, timeout=600)


@pytest.mark.parametrize("call, op, kind", [(5, "q6k_gemv", "op"),  # its variants are made in a factory
                                            (6, "kv_scatter", "function")])  # launches with replay.launch(path=)
def test_a_clean_call_reproduces_without_kernel_replay(bare_python: Path, tmp_path: Path, call: int, op: str,
                                                       kind: str) -> None:
    out = tmp_path / f"call{call}"
    made = CliRunner().invoke(cli_main, ["repro", str(SHIPPED), "--call", str(call), "-o", str(out)])
    assert made.exit_code == 0, made.output
    assert {p.name for p in out.iterdir()} == {"call.json", "call.safetensors", "code", "repro.py"}
    assert json.loads((out / "call.json").read_text())["kind"] == kind
    ran = _run(bare_python, out)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"call {call} ({op}, batched) of prefill_001: reproduced, no divergence" in ran.stdout


def test_a_planted_bug_diverges_here_and_there(bare_python: Path, tmp_path: Path) -> None:
    out = tmp_path / "call0"
    made = CliRunner().invoke(cli_main, ["repro", str(SHIPPED), "--call", "0", "-o", str(out),
                                         "--code", str(edited_kernels(tmp_path, RMSNORM_MEAN_OVER_H_PLUS_1))])
    assert made.exit_code == 1 and "diverges here" in made.output
    ran = _run(bare_python, out)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "out: DIFFERS" in ran.stdout and "DIVERGES" in ran.stdout
    good = tmp_path / "good"  # the kernel's owner tries their own checkout against the same call
    shutil.copytree(ROOT / "kernels", good / "replay_kernels", ignore=shutil.ignore_patterns("__pycache__"))
    fixed = subprocess.run([str(bare_python), str(out / "repro.py"), "--code", str(good)],
                           capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr


def test_repro_refuses_what_it_cannot_write(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    busy = CliRunner().invoke(cli_main, ["repro", str(SHIPPED), "--call", "0", "-o", str(tmp_path / "full")])
    assert busy.exit_code == 2 and "not empty" in busy.output
    missing = CliRunner().invoke(cli_main, ["repro", str(SHIPPED), "--call", "999", "-o", str(tmp_path / "x")])
    assert missing.exit_code == 2
