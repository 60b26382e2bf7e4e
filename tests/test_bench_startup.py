"""scripts/bench_startup.py: fresh processes timed, torch's import the floor, another tree's replay beside this one's."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_startup.py"


def marked_tree(tmp_path: Path) -> tuple[Path, Path]:
    """A tree whose `replay` is this one's, leaving a mark when imported, and the mark."""
    mark = tmp_path / "imported"
    (tmp_path / "tree" / "replay").mkdir(parents=True)
    (tmp_path / "tree" / "replay" / "__init__.py").write_text(
        f"import pathlib\npathlib.Path({str(mark)!r}).write_text('yes')\n"
        f"__path__[:] = [{str(ROOT / 'replay')!r}]  # its modules are this tree's\n"
        f"exec(compile(pathlib.Path(__path__[0], '__init__.py').read_text(), 'replay/__init__.py', 'exec'))\n")
    return tmp_path / "tree", mark


def test_each_process_is_timed_against_the_floor_for_both_trees(tmp_path: Path) -> None:
    tree, mark = marked_tree(tmp_path)
    # run from this checkout, as a user would: the other tree's rows must import its replay, not the
    # checkout's that `python -c` would find first
    done = subprocess.run([sys.executable, str(SCRIPT), "--runs", "1", "--against", str(tree)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert mark.exists()
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert re.fullmatch(r"\| python -c 'import torch' \(the floor\) \| this tree \| \d+ \| 1\.00x \|", rows[0])
    trees = [row.split(" | ")[1] for row in rows[1:]]
    assert trees == ["this tree", str(tree)] * 3  # each replay row for both trees
    for row in rows[1:]:
        assert re.fullmatch(r"\| (python -c 'import replay.cli'|replay --help|replay show snapshots/prefill_001) "
                            r"\| .+ \| \d+ \| \d+\.\d\dx \|", row), row


def test_a_tree_without_kernel_replay_is_refused_by_name(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--against", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"--against {tmp_path}: no kernel-replay tree there (no replay/__init__.py)" in done.stderr


def test_fewer_than_one_run_is_refused_by_name() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--runs", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--runs 0: must be at least 1" in done.stderr
