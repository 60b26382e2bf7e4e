"""Detached worktrees of the user's repository, one per probe, under one temporary root.

The user's own working tree, index, HEAD and stash are never touched: every
checkout happens in a worktree of its own, removed (`git worktree remove`, which
also drops its entry in .git/worktrees) when the probe ends and again on close.
Roots are named replay-bisect-<pid>-*, so the next run can tell a worktree a
killed run left behind (its pid is gone) and remove it. `git worktree add` and
`remove` are not safe to run side by side in one repository (one reads the
other's half-written .git/worktrees entry), so parallel probes take turns at them.

Ctrl-C must not cut an add or a remove in two. A terminal sends SIGINT to its
whole foreground process group, so these git commands run in a session of their
own (a `git worktree remove` killed between deleting the directory and its entry
leaves a prunable entry); in the main thread, signals are held until each one is
done (interrupts.deferred). Whatever a git killed anyway (SIGKILL) leaves in
.git/worktrees for this run's root is deleted on close, as `git worktree prune`
would, which cannot be told to spare the user's own prunable worktrees.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Iterator

import git

from replay.bisect import interrupts

PREFIX = "replay-bisect-"
_ROOT_NAME = re.compile(rf"^{PREFIX}(\d+)-")


class Worktrees:
    def __init__(self, repo: git.Repo) -> None:
        self.repo = repo
        self.root = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        self.neutral_dir = self.root / "cwd"  # where probes that must not see a worktree start
        self.neutral_dir.mkdir()
        self._live: set[Path] = set()
        self._lock = threading.Lock()  # guards _live and serialises git worktree add/remove
        self._numbers = itertools.count(1)

    @contextlib.contextmanager
    def checkout(self, sha: str) -> Iterator[Path]:
        """A fresh detached worktree at `sha`, removed when the block ends."""
        with self._lock:
            path = self.root / f"{next(self._numbers):04d}-{sha[:12]}"
            self._live.add(path)  # before the add: close() removes it whatever happens next
        try:
            with interrupts.deferred(), self._lock:
                _worktree_command(self.repo, "add", "--detach", "--quiet", str(path), sha)
            yield path
        finally:
            self._remove(path)

    def _remove(self, path: Path) -> None:
        with interrupts.deferred(), self._lock:
            _remove_worktree(self.repo, path)
            self._live.discard(path)

    def close(self) -> None:
        with interrupts.deferred():
            with self._lock:
                leftovers = list(self._live)
            for path in leftovers:
                self._remove(path)
            with self._lock:
                _drop_entries(self.repo, self.root)
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Worktrees:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def remove_stale(repo: git.Repo) -> list[Path]:
    """Remove the worktrees of bisect runs whose process is gone; return their paths."""
    stale = [path for path in registered_worktrees(repo)
             if (m := _ROOT_NAME.match(path.parent.name)) and not _alive(int(m[1]))]
    with interrupts.deferred():  # whole: a root goes only with every worktree in it
        for path in stale:
            _remove_worktree(repo, path)
        for root in {path.parent for path in stale}:
            shutil.rmtree(root, ignore_errors=True)
    return stale


def registered_worktrees(repo: git.Repo) -> list[Path]:
    fields = repo.git.worktree("list", "--porcelain", "-z").split("\0")
    return [Path(f.removeprefix("worktree ")) for f in fields if f.startswith("worktree ")]


def _worktree_command(repo: git.Repo, *args: str) -> str:
    """`git worktree ARGS` in a session of its own, out of reach of the terminal's Ctrl-C."""
    return repo.git.execute([repo.git.GIT_PYTHON_GIT_EXECUTABLE, "worktree", *args], start_new_session=True)


def _remove_worktree(repo: git.Repo, path: Path) -> None:
    # Twice --force: also removes a worktree whose `add` was killed while still locked.
    with contextlib.suppress(git.GitCommandError):
        _worktree_command(repo, "remove", "--force", "--force", str(path))
    shutil.rmtree(path, ignore_errors=True)
    _drop_entries(repo, path)


def _drop_entries(repo: git.Repo, under: Path) -> None:
    """Delete the .git/worktrees entries of the worktrees at or under `under`, whose directories
    are removed: what a git killed mid-way leaves (`git worktree prune`, for this path alone)."""
    under = under.resolve()
    entries = Path(repo.common_dir) / "worktrees"
    dropped = False
    for gitdir in entries.glob("*/gitdir"):
        with contextlib.suppress(OSError, ValueError):  # another run's entry, half-written
            worktree = (gitdir.parent / gitdir.read_text().strip()).parent.resolve()  # absolute, or relative to it
            if worktree == under or under in worktree.parents:
                shutil.rmtree(gitdir.parent)
                dropped = True
    if dropped:
        with contextlib.suppress(OSError):
            entries.rmdir()  # as git leaves it when the last entry goes


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True
