"""`replay demo`: the history it builds, and the whole loop end to end on CPU."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from replay import demo
from replay.cli import main


def test_history_plants_one_bug_and_one_refactor() -> None:
    commits = demo.kernel_history(demo.kernel_sources())
    assert len(commits) == demo.HISTORY_LENGTH
    bug = commits[demo.BUG_AT]
    assert bug.message == demo.BUG_SUBJECT and list(bug.files) == [demo.BUG_FILE]
    before = commits[demo.REFACTOR_AT].files[demo.BUG_FILE]  # the last commit before it to touch the file
    patch = bug.files[demo.BUG_FILE].removeprefix(before)
    assert patch != bug.files[demo.BUG_FILE]  # the planted commit only appends
    assert patch.lstrip().startswith(f"{demo.BUG_DECORATOR}\ndef {demo.BUG_FUNCTION}(") and "indirect=True" in patch
    refactor = commits[demo.REFACTOR_AT].files[demo.REFACTOR_FILE]
    assert "cache_geometry" in refactor and not demo.REFACTOR_PATTERN.search(refactor)
    others = [c for i, c in enumerate(commits[1:], 1) if i not in (demo.BUG_AT, demo.REFACTOR_AT)]
    assert all(demo.BUG_FILE not in c.files for c in others)


def test_demo_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep me")
    result = CliRunner().invoke(main, ["demo", str(tmp_path)])
    assert result.exit_code == 2
    assert "not empty" in result.stderr and (tmp_path / "precious.txt").read_text() == "keep me"


@pytest.mark.slow  # about a minute on 2 CPU cores: the whole demo
def test_demo_bisects_to_the_planted_commit(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["demo", "--jobs", "2", str(tmp_path / "demo")])  # two probes a round: faster on 2 cores
    assert result.exit_code == 0, result.output
    planted = subprocess.run(["git", "log", "--format=%H", "-1", f"--grep={demo.BUG_SUBJECT}"],
                             cwd=tmp_path / "demo" / "kernel-history", capture_output=True, text=True).stdout.strip()
    assert f"First bad commit {planted}" in result.output
    assert "replay run at v1.2: pass" in result.output
    assert "replay run at HEAD: DIVERGED" in result.output and "kv_scatter" in result.output
    assert "first diverging tag positions wrong at rows [1, 2, 3] of 4" in result.output
