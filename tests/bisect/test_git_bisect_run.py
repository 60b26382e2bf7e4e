"""`git bisect run replay run ...`: git reads 0 as good, 125 as skip, 1-127 as bad and stops at 128 and
above, so inside a git bisect bad input and internal errors exit 255: no commit is marked bad for them."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bisect_helpers import git
from fixtures.make_fixture_snapshot import make_fixture_snapshot

REPLAY = str(Path(sys.executable).with_name("replay"))
# an internal error (a bug in kernel-replay), planted where replay runs a call
CRASHING = (f"{sys.executable} -c \"import sys, replay.engine.session as s; from replay.cli import main; "
            "s._run_and_check = lambda *a, **k: 1 / 0; main(sys.argv[1:])\" run {snapshot} --code {tests}")
TESTS = Path(__file__).resolve().parents[1]


def git_bisect_run(repo: Path, command: str) -> subprocess.CompletedProcess[str]:
    git(repo, "bisect", "start", "HEAD", f"HEAD~{len(git(repo, 'rev-list', 'HEAD').split()) - 1}")
    try:
        return subprocess.run(f"git bisect run {command}", shell=True, cwd=repo, capture_output=True, text=True,
                              timeout=300)
    finally:
        marked = git(repo, "for-each-ref", "--format=%(refname)", "refs/bisect/")
        git(repo, "bisect", "reset")
        assert marked.split() == ["refs/bisect/bad"] + [line for line in marked.split() if "good" in line], marked


@pytest.mark.parametrize("what, command", [
    ("bad input", f"{REPLAY} run no-such-snapshot"),
    ("an internal error", CRASHING),
])
def test_git_bisect_run_stops_rather_than_marking_a_commit_bad(make_linear, what: str, command: str,
                                                               tmp_path: Path) -> None:
    history = make_linear(6, bug_at=4)
    snapshot = make_fixture_snapshot(tmp_path / "snap")
    done = git_bisect_run(history.path, command.format(snapshot=snapshot, tests=TESTS))
    output = done.stdout + done.stderr
    assert "exit code 255" in output and "is the first bad commit" not in output, output
    assert f"replay: exit 255 instead of {2 if what == 'bad input' else 70} ({what})" in output
