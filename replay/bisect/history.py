"""The user's repository, read only: refs, the range to bisect, and commit descriptions."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import git

from replay.errors import BisectError
from replay.bisect.search import CommitGraph


@dataclass(frozen=True)
class CommitInfo:
    sha: str
    author: str
    date: str  # author date, ISO 8601
    subject: str
    files: tuple[tuple[str, int, int], ...]  # (path, lines added, lines removed) against the first parent

    @property
    def short(self) -> str:
        return self.sha[:10]

    def to_json(self) -> dict[str, Any]:
        return {"sha": self.sha, "author": self.author, "date": self.date, "subject": self.subject,
                "files": [{"path": p, "added": a, "removed": r} for p, a, r in self.files]}


def open_repo(path: Path) -> git.Repo:
    """The git repository containing `path` (as git itself finds it from a subdirectory)."""
    try:
        return git.Repo(path, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise BisectError(f"not a git repository: {path}") from None


def resolve_commit(repo: git.Repo, ref: str, option: str) -> str:
    """The full sha of the commit `ref` names; `option` names it in the error."""
    try:
        return repo.git.rev_parse("--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}")
    except git.GitCommandError:
        raise BisectError(f"{option} {ref}: no such commit in {repo.working_dir}") from None


def load_range(repo: git.Repo, good: str, bad: str, first_parent: bool) -> CommitGraph:
    """The commits that may be the first bad one: ancestors of `bad` (itself included)
    that are not ancestors of `good`, parents before children.

    With `first_parent` only the first-parent chain of `bad` counts, so a merged
    branch is judged as its merge commit, as `git bisect --first-parent` does.
    """
    if good == bad:
        raise BisectError(f"--good and --bad are the same commit ({good[:10]})")
    if not _is_ancestor(repo, good, bad):
        raise BisectError(f"--good {good[:10]} is not an ancestor of --bad {bad[:10]}")
    lines = repo.git.rev_list("--topo-order", "--reverse", "--parents", bad, f"^{good}").splitlines()
    parents_of = {sha: rest for sha, *rest in (line.split() for line in lines)}
    shas = _first_parent_chain(parents_of, bad) if first_parent else [line.split()[0] for line in lines]
    index = {sha: i for i, sha in enumerate(shas)}
    keep = 1 if first_parent else None
    parents = tuple(tuple(index[p] for p in parents_of[sha][:keep] if p in index) for sha in shas)
    return CommitGraph(tuple(shas), parents)


def _first_parent_chain(parents_of: dict[str, list[str]], bad: str) -> list[str]:
    chain, sha = [], bad
    while sha in parents_of:  # leaves the range at the first ancestor of good
        chain.append(sha)
        sha = parents_of[sha][0] if parents_of[sha] else ""
    return chain[::-1]


def _is_ancestor(repo: git.Repo, ancestor: str, descendant: str) -> bool:
    try:
        repo.git.merge_base("--is-ancestor", ancestor, descendant)
        return True
    except git.GitCommandError:
        return False


def describe_commit(repo: git.Repo, sha: str) -> CommitInfo:
    commit = repo.commit(sha)
    files = tuple((str(path), stat["insertions"], stat["deletions"]) for path, stat in commit.stats.files.items())
    return CommitInfo(sha=sha, author=f"{commit.author.name} <{commit.author.email}>",
                      date=commit.authored_datetime.isoformat(), subject=cast(str, commit.summary), files=files)


def first_parent(repo: git.Repo, sha: str) -> str | None:
    parents = repo.commit(sha).parents
    return parents[0].hexsha if parents else None
