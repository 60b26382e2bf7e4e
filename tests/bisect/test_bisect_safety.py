"""The user's repository is never touched: not on Ctrl-C, and a killed run's worktree is removed next time."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bisect_helpers import git, make_dirty, repo_state
from replay.bisect.worktrees import PREFIX

SLOW = "sleep 1; test ! -f BUG"


def start_bisect(history, tmp: Path, log: Path) -> subprocess.Popen:
    """`python -m replay bisect` with a slow probe, its temporary files under `tmp`."""
    tmp.mkdir(exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "replay", "bisect", "--good", history.shas[0], "--bad", "HEAD", "--run", SLOW,
         "--log", str(log)],
        cwd=history.path, env={**os.environ, "TMPDIR": str(tmp)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=_ctrl_c_as_from_a_terminal)


def _ctrl_c_as_from_a_terminal() -> None:
    # a suite started in the background by a non-interactive shell inherits SIGINT ignored, and Python then
    # never turns SIGINT into KeyboardInterrupt: give the bisect the disposition a terminal's foreground has
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_probe(proc: subprocess.Popen, repo: Path) -> None:
    """Until a probe's worktree exists (a probe is under way)."""
    deadline = time.monotonic() + 60
    while not any(PREFIX in str(p) for p in registered_worktrees_of(repo)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no probe started"
        time.sleep(0.05)


def registered_worktrees_of(repo: Path) -> list[Path]:
    out = git(repo, "worktree", "list", "--porcelain")
    return [Path(line.split(" ", 1)[1]) for line in out.splitlines() if line.startswith("worktree ")]


def test_ctrl_c_mid_bisect_leaves_the_users_repository_byte_identical(make_linear, tmp_path):
    history = make_linear(50, bug_at=20)
    make_dirty(history.path)
    before = repo_state(history.path)
    proc = start_bisect(history, tmp_path / "tmp", tmp_path / "log")
    wait_for_probe(proc, history.path)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr
    assert repo_state(history.path) == before
    assert list((tmp_path / "tmp").iterdir()) == []
    assert "probing" in (tmp_path / "log").read_text()


def test_a_worktree_left_by_a_killed_run_is_removed_at_the_next_start(make_linear, tmp_path):
    history = make_linear(50, bug_at=20)
    before = repo_state(history.path)
    proc = start_bisect(history, tmp_path / "tmp", tmp_path / "log")
    wait_for_probe(proc, history.path)
    proc.send_signal(signal.SIGKILL)  # no cleanup can run
    proc.communicate()
    assert any(PREFIX in str(p) for p in registered_worktrees_of(history.path))
    steps = []
    result = history.bisect(on_step=steps.append)
    assert result.first_bad.sha == history.shas[20]
    assert [s.kind for s in steps].count("prune") == 1
    assert repo_state(history.path) == before
    assert list((tmp_path / "tmp").iterdir()) == []
