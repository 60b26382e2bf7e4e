"""Generated repositories for bisect tests: tiny commits, a BUG file planted at a known commit."""
from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass
from pathlib import Path

from replay.bisect import BisectOptions, BisectResult, StepHandler, SyntheticCommit, run_bisect, write_history

CHECK = "test ! -f BUG"  # the probe: bad once the planted BUG file exists


@dataclass
class History:
    path: Path
    shas: list[str]  # shas[0] is the good root; the last is HEAD

    def bisect(self, run: str = CHECK, good: str | None = None, bad: str = "HEAD", on_step: StepHandler | None = None,
               **options: object) -> BisectResult:
        return run_bisect(BisectOptions(good=good or self.shas[0], bad=bad, repo=self.path, run=run, **options),
                          on_step)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def linear(path: Path, n: int, bug_at: int, extra: dict[int, dict[str, str]] | None = None) -> History:
    """A root (good) and n commits after it; commit `bug_at` (1..n) plants BUG, which stays.

    `extra` adds files to some commits (markers that probes react to, like SKIP).
    """
    commits = []
    for i in range(n + 1):
        files = {"counter": f"{i}\n", **(extra or {}).get(i, {})}
        if i == bug_at:
            files["BUG"] = "planted\n"
        commits.append(SyntheticCommit(f"commit {i}", files))
    return History(path, write_history(path, commits))


def git_bisect_run(repo: Path, good: str, bad: str, command: str, tmp: Path, first_parent: bool = False) -> str:
    """The first bad commit `git bisect run` finds, in a clone so `repo` is left alone."""
    clone = tmp / f"clone-{hashlib.sha1(str(repo).encode()).hexdigest()[:8]}"
    subprocess.run(["git", "clone", "-q", str(repo), str(clone)], check=True, capture_output=True)
    git(clone, "bisect", "start", *(["--first-parent"] if first_parent else []), bad, good)
    out = subprocess.run(["git", "bisect", "run", "sh", "-c", command], cwd=clone, capture_output=True,
                         text=True).stdout
    return next(line.split()[0] for line in out.splitlines() if line.endswith("is the first bad commit"))


def repo_state(repo: Path) -> dict[str, str]:
    """Everything bisect must not change: status, HEAD, worktrees, stash, and every file's bytes."""
    files = sorted(p for p in repo.rglob("*") if p.is_file() and ".git" not in p.relative_to(repo).parts)
    digest = hashlib.sha256()
    for p in files:
        digest.update(str(p.relative_to(repo)).encode() + b"\0" + p.read_bytes())
    return {"status": git(repo, "status", "--porcelain", "--untracked-files=all"), "head": git(repo, "rev-parse", "HEAD"),
            "symbolic": git(repo, "symbolic-ref", "-q", "HEAD"), "worktrees": git(repo, "worktree", "list", "--porcelain"),
            "stash": git(repo, "stash", "list"), "files": digest.hexdigest()}


def make_dirty(repo: Path) -> None:
    """A user mid-work: a stash entry, a staged edit, an unstaged edit and an untracked file."""
    (repo / "counter").write_text("stashed\n")
    git(repo, "-c", "user.name=u", "-c", "user.email=u@x", "stash", "push", "-q")
    (repo / "counter").write_text("staged\n")
    git(repo, "add", "counter")
    (repo / "counter").write_text("unstaged\n")
    (repo / "notes.txt").write_text("untracked\n")


def leftover_worktrees(repo: Path) -> str:
    """What no bisect may leave: worktrees besides the main one, and what `git worktree prune` would remove."""
    listed = [line for line in git(repo, "worktree", "list", "--porcelain").splitlines() if line.startswith("worktree ")]
    prune = subprocess.run(["git", "worktree", "prune", "--dry-run", "-v"], cwd=repo, capture_output=True, text=True)
    return "\n".join(listed[1:] + (prune.stdout + prune.stderr).splitlines())
