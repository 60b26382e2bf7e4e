"""scripts/bench_startup.py: fresh processes timed, torch's import the floor, another tree's replay beside this one's."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_startup.py"


def test_each_process_is_timed_against_the_floor_for_both_trees() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--runs", "1", "--against", str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert re.fullmatch(r"\| python -c 'import torch' \(the floor\) \| this tree \| \d+ \| 1\.00x \|", rows[0])
    trees = [row.split(" | ")[1] for row in rows[1:]]
    assert trees == ["this tree", str(ROOT)] * 3  # each replay row for both trees
    for row in rows[1:]:
        assert re.fullmatch(r"\| (python -c 'import replay.cli'|replay --help|replay show snapshots/prefill_001) "
                            r"\| .+ \| \d+ \| \d+\.\d\dx \|", row), row


def test_a_tree_without_kernel_replay_is_refused_by_name(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--against", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"--against {tmp_path}: no kernel-replay tree there (no replay/__init__.py)" in done.stderr
