"""A user's own project, end to end, as README.md's "Use it on your own project" teaches it.

The project (tests/user_project/) has three Triton kernels registered as ops, a plain-PyTorch
function captured as it is, runtime state (position_buf), a tag v1.0, and a history with two
planted bugs: one inside the reference's tolerance (an eps folded to another value) and one far
outside it (rotary positions from the program id), with a commit between them that no longer
takes the recorded arguments. The README's commands run on it as written, recorded at the bad end.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from user_project.history import TEMPLATE, Project, build
from user_shell import fenced, run_as_written, shell

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Use it on your own project"

pytestmark = pytest.mark.slow


def readme_section() -> str:
    text = README.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start:end if end != -1 else None]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """The project with snapshots/bad_run recorded at HEAD."""
    project = build(tmp_path_factory.mktemp("user") / "mymodel")
    done = shell("python record.py snapshots/bad_run", project.path)
    assert done.returncode == 0, done.stderr
    return project


def test_the_readme_shows_the_projects_own_record_script() -> None:
    scripts = [block for block in fenced(readme_section(), "python") if "replay.recording(" in block]
    assert scripts == [(TEMPLATE / "record.py").read_text()]


def test_the_readme_commands_as_written_name_each_bad_commit(tmp_path: Path) -> None:
    project = build(tmp_path / "mymodel")
    lines = [line for block in fenced(readme_section(), "bash") for line in block.splitlines()
             if line.strip() and not line.startswith("pip ")]  # installing: this environment has it already
    outside, inside = project.commits["outside"], project.commits["inside"]
    expected = [  # (what the line starts with, its exit code, what its output must say)
        ("python record.py snapshots/bad_run", 0, "out[0, :4]"),
        ("replay run snapshots/bad_run --code .", 1, "op rotary, variant batched"),
        ("replay run snapshots/bad_run --code . --golden-data", 0, "all 4 calls passed"),
        ("replay bisect --good v1.0 --bad HEAD snapshots/bad_run", 0, f"First bad commit {outside}"),
        ("replay bisect --good v1.0 --bad HEAD snapshots/bad_run --oracle good-end", 0, f"First bad commit {inside}"),
        ("git bisect start HEAD v1.0 && git bisect run replay run snapshots/bad_run", 0,
         f"{outside} is the first bad commit"),
    ]
    run_as_written(lines, expected, project.path)


def test_both_ends_passing_the_references_bisects_against_the_good_end(recorded: Project) -> None:
    project = recorded
    # no bug outside tolerance in this range: the references cannot tell the ends apart
    done = shell(f"replay bisect --good v1.0 --bad {project.commits['signature_fixed']} snapshots/bad_run --json -",
                 project.path)
    answer = json.loads(done.stdout)
    assert done.returncode == 0, done.stderr
    assert answer["oracle"] == "good-end" and "both ends pass the reference checks" in answer["oracle_note"]
    assert answer["first_bad"]["sha"] == project.commits["inside"]


def test_a_commit_that_no_longer_takes_the_recorded_arguments_is_untestable(recorded: Project, tmp_path: Path) -> None:
    project = recorded
    worktree = tmp_path / "at-signature"
    subprocess.run(["git", "worktree", "add", "-q", "--detach", str(worktree), project.commits["signature"]],
                   cwd=project.path, check=True)
    try:
        done = shell(f"replay run snapshots/bad_run --code {worktree} --oracle reference", project.path)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=project.path, check=True)
    assert done.returncode == 125, done.stdout + done.stderr
    assert "no longer takes the recorded arguments: missing a required argument: 'epsilon'" in \
        " ".join(done.stdout.split())
