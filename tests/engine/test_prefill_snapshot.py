"""`replay run` on the committed prefill snapshot with the real kernels (CPU: interpreter).

Planted bugs are swapped in for a replay in this process (replay_kernels.bugs.planting), or made by
editing a copy of the kernels and replaying it with --code, as a bisect probe does.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
import triton
from click.testing import CliRunner

import replay_kernels
from replay_kernels import bugs
from replay.cli import main

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "snapshots" / "prefill_001"
TOKENS = 8


def replay_json(*args: str, interpret: bool = False) -> tuple[int, dict]:
    """Run `python -m replay ... --json -` as a user would; return exit code and report.
    `interpret`: Triton's interpreter on, as the CPU recording of the shipped snapshot had it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **({"TRITON_INTERPRET": "1"} if interpret else {})}
    done = subprocess.run([sys.executable, "-m", "replay", *args, "--json", "-"], capture_output=True,
                          text=True, env=env, cwd=ROOT)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def replay_with_bug(bug: str, *args: str) -> tuple[int, dict]:
    """`replay ... --json -` in this process, with the planted bug swapped in."""
    with bugs.planting(bug):
        result = CliRunner().invoke(main, [*args, "--json", "-"])
    assert result.stdout.strip(), result.output
    return result.exit_code, json.loads(result.stdout)


def edited_kernels(tmp_path: Path, module: str, edit: Callable[[str], str]) -> Path:
    """A copy of the kernels package with `module`'s source edited, for --code."""
    tree = tmp_path / "edited"
    shutil.copytree(Path(replay_kernels.__file__).parent, tree / "replay_kernels", ignore=shutil.ignore_patterns("__pycache__"))
    path = tree / "replay_kernels" / module
    source = path.read_text()
    edited = edit(source)
    assert edited != source, f"{module}: the edit point moved"
    path.write_text(edited)
    return tree


def test_committed_prefill_replays_clean() -> None:
    code, report = replay_json("run", str(SNAPSHOT))
    assert code == 0, report["first_divergence"]
    assert report["calls_checked"] == 34
    ops = {c["op"] for c in report["calls"]}
    assert ops == {"rmsnorm", "residual_add", "rope", "swiglu", "q4k_gemv", "q6k_gemv", "kv_scatter", "attention"}


def recorded_environment() -> dict:
    return json.loads((SNAPSHOT / "manifest.json").read_text())["environment"]


@pytest.mark.skipif(
    (recorded_environment()["torch"], recorded_environment()["triton"]) != (torch.__version__, triton.__version__),
    reason="golden data is bitwise only under the torch and Triton that recorded it (see its manifest)")
def test_shipped_snapshot_holds_its_golden_data_at_head() -> None:
    # Fails when the kernels change their bits without `python scripts/make_snapshots.py`.
    code, report = replay_json("run", str(SNAPSHOT), "--golden-data", "--device", "cpu", interpret=True)
    assert code == 0, report["first_divergence"]
    assert report["calls_checked"] == 34 and report["mode"] == "golden"


def test_stale_position_buf_prefill_named() -> None:
    code, report = replay_with_bug("kv_scatter_stale_position_buf", "run", str(SNAPSHOT), "--op", "kv_scatter")
    assert code == 1
    first = report["first_divergence"]
    assert (first["op"], first["variant"], first["call"]) == ("kv_scatter", "batched", 6)
    assert first["tag"] == "positions" and first["tag_rows"] == list(range(1, TOKENS))
    assert "expects [0, 1, 2, 3, 4, 5, 6, 7]" in first["description"]


def test_batched_q6k_dequantisation_error_named() -> None:
    code, report = replay_with_bug("q6k_scale_index", "run", str(SNAPSHOT), "--op", "q6k_gemv")
    assert code == 1
    first = report["first_divergence"]
    assert (first["op"], first["variant"], first["kind"]) == ("q6k_gemv", "batched", "single-vs-batched")
    assert first["rows"] == list(range(TOKENS)) and first["rows_total"] == TOKENS
    single_vs_reference = [c for call in report["calls"] for c in call["checks"]
                           if c["kind"] == "vs-reference" and c["variant"] == "single"]
    assert single_vs_reference and all(c["passed"] for c in single_vs_reference)


def test_nondeterministic_kernel_caught_by_repeat(tmp_path: Path) -> None:
    batched_return = '    return launch.elementwise_rows("residual_add", _residual_add_kernel, x=x, residual=residual)\n'

    def make_racy(source: str) -> str:
        head, _, tail = source.rpartition(batched_return)  # the batched variant's return, not single's
        return (head + batched_return.replace("return", "out =")
                + "    return out + (torch.rand_like(out) < 0.05) * 1e-3  # planted: a read another block races on\n"
                + tail)

    tree = edited_kernels(tmp_path, "residual_add.py", make_racy)
    code, report = replay_json("run", str(SNAPSHOT), "--op", "residual_add", "--variant", "batched",
                               "--repeat", "3", "--code", str(tree))
    assert code == 1
    repeats = [c for call in report["calls"] for c in call["checks"] if c["kind"] == "repeat"]
    assert repeats and repeats[0]["variant"] == "batched" and "nondeterministic 'out'" in repeats[0]["description"]
    code, report = replay_json("run", str(SNAPSHOT), "--op", "residual_add", "--variant", "batched", "--repeat", "3")
    assert code == 0


def test_kernel_edited_after_recording_caught_by_golden_data(tmp_path: Path) -> None:
    # Golden data is bitwise, so the baseline is recorded here, on this machine's device.
    recorded = tmp_path / "prefill"
    record = subprocess.run([sys.executable, "-c", "import sys; from replay_kernels.model import record_prefill; "
                             "record_prefill(sys.argv[1])", str(recorded)], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert record.returncode == 0, record.stderr
    tree = edited_kernels(tmp_path, "rmsnorm.py", lambda source: source.replace(
        "tl.sum(x * x, axis=0) / H + eps)", "tl.sum(x * x, axis=0) / H + 2 * eps)"))
    code, report = replay_json("run", str(recorded), "--op", "rmsnorm", "--golden-data", "--code", str(tree))
    assert code == 1
    first = report["first_divergence"]
    assert (first["op"], first["variant"], first["kind"], first["call"]) == ("rmsnorm", "batched", "vs-golden", 0)
    assert first["tag"] == "rstd" and first["tag_rows"]
    code, report = replay_json("run", str(recorded), "--op", "rmsnorm", "--golden-data")
    assert code == 0, report["first_divergence"]
