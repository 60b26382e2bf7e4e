"""scripts/bench_launches.py --against: rounds alternating this tree's recording with another
tree's, in processes of their own, each importing `replay` from its tree (CPU smoke shapes)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_launches.py"
SMOKE = ["--shape", "8", "64", "2", "128", "96", "--steps", "2"]


def test_each_round_times_bare_and_both_trees_recordings_and_the_medians_come_last() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *SMOKE, "--against", str(ROOT), "--rounds", "2"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert rows[0] == f"| round | bare | this tree | {ROOT} |"
    number = r"\d+\.\d"
    assert len(rows) == 5  # the header, its rule, two rounds, the medians
    for label, row in zip(["1", "2", "median"], rows[2:]):
        assert re.fullmatch(rf"\| {label} \| {number} \| {number} \| {number} \|", row), row


def test_a_tree_without_kernel_replay_is_refused_by_name(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *SMOKE, "--against", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert f"--against {tmp_path}: no kernel-replay tree there (no replay/__init__.py)" in done.stderr


def test_the_recorders_kernels_compile_in_a_recording_of_their_own_before_the_timed_modes() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *SMOKE, "--modes", "bare,record"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = {line.split(" | ")[0]: line for line in done.stdout.splitlines() if line.startswith("| ")}
    assert {"| bare", "| record"} <= set(rows), done.stdout
    cold = re.search(r"a one-step recording compiled the recorder's own kernels .*: its step took (\d+\.\d) ms, "
                     r"its (\d+\.\d) MB written in (\d+\.\d) ms", done.stdout)
    assert cold is not None, done.stdout
    assert float(cold[3]) >= float(cold[1]) > 0  # its bytes are written after its step ends, not before
