"""When golden data may not hold bit for bit: the recording's code and environment against this replay's."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from replay.engine.provenance import code_differences, golden_warning
from replay.snapshot.manifest import environment


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def kernel_repo(tmp_path: Path) -> tuple[Path, str]:
    """A repository whose package `kern` is committed once; returns the package and the commit."""
    repo = tmp_path / "repo"
    (repo / "kern").mkdir(parents=True)
    (repo / "kern" / "op.py").write_text("x = 1\n")
    (repo / "README").write_text("notes\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "kernels")
    return repo / "kern", git(repo, "rev-parse", "HEAD")


def manifest(commit: str | None, dirty: bool = False, **env: str) -> dict:
    return {"producer": {"git": {"commit": commit, "dirty": dirty} if commit else None},
            "environment": {**environment(), "device": "cpu", **env}}


def test_same_code_and_environment_warn_nothing(kernel_repo: tuple[Path, str]) -> None:
    package, commit = kernel_repo
    (package.parent / "README").write_text("edited notes\n")  # outside the package: not the code under test
    assert golden_warning(manifest(commit), "cpu", [package]) is None


def test_an_edited_kernel_is_named(kernel_repo: tuple[Path, str]) -> None:
    package, commit = kernel_repo
    (package / "op.py").write_text("x = 2\n")
    assert code_differences(commit, False, [package]) == [f"kern/ changed since the recorded commit {commit[:10]} "
                                                          f"(op.py)"]


def test_unknown_commit_dirty_recording_and_other_environment_all_said_in_one_line(
        kernel_repo: tuple[Path, str]) -> None:
    package, _ = kernel_repo
    warning = golden_warning(manifest("f" * 40, dirty=True, triton="0.0", device="NVIDIA H100 80GB HBM3"), "cpu",
                             [package])
    assert warning is not None and "\n" not in warning
    for reason in ("device NVIDIA H100 80GB HBM3 then, cpu now", "triton 0.0 then",
                   "recorded from a work tree with uncommitted changes",
                   f"{package} is not in a git repository holding the recorded commit ffffffffff",
                   "use --atol/--rtol, or record the snapshot again here"):
        assert reason in warning


def test_a_snapshot_without_a_commit_says_so() -> None:
    assert code_differences(None, False, []) == ["the snapshot records no git commit"]


def test_a_new_untracked_kernel_file_and_a_loose_module_are_seen(kernel_repo: tuple[Path, str]) -> None:
    package, commit = kernel_repo
    (package / "new_kernel.py").write_text("y = 1\n")
    assert code_differences(commit, False, [package]) == [f"kern/ changed since the recorded commit {commit[:10]} "
                                                          f"(new_kernel.py)"]
    assert code_differences(commit, False, [package / "op.py"]) == []  # a module file: only itself counts
    (package / "op.py").write_text("x = 3\n")
    assert code_differences(commit, False, [package / "op.py"]) == [f"op.py changed since the recorded commit "
                                                                    f"{commit[:10]} (op.py)"]


def test_the_advice_does_not_repeat_what_was_given(kernel_repo: tuple[Path, str]) -> None:
    package, commit = kernel_repo
    warning = golden_warning(manifest(commit, triton="0.0"), "cpu", [package], tolerance_given=True)
    assert warning is not None and "--atol" not in warning and "record the snapshot again here" in warning
