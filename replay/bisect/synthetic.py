"""Throwaway git histories written in one `git fast-import` pass.

Tests, the benchmark and the demo need histories of hundreds of commits; one
`git commit` per commit costs a process each, fast-import writes them all at once.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

AUTHOR = "Replay Bisect <bisect@example.com>"
EPOCH = 1_763_800_000  # a fixed start keeps the generated shas reproducible


@dataclass(frozen=True)
class SyntheticCommit:
    """One commit: files to write (content) or delete (None), and its parents.

    `parents` are indices of earlier commits in the same list; None means the
    previous commit (or none for the first), so a plain list is a linear history.
    A merge's tree starts from its first parent's: list the files it brings in.
    """

    message: str
    files: Mapping[str, str | None] = field(default_factory=dict)
    parents: Sequence[int] | None = None


def write_history(repo_dir: Path, commits: Sequence[SyntheticCommit], branch: str = "main") -> list[str]:
    """Create a git repository at `repo_dir` holding `commits`; return their shas in order.

    `branch` points at the last commit and is checked out.
    """
    repo_dir.mkdir(parents=True, exist_ok=True)
    _git(repo_dir, "init", "-q", "-b", branch)
    marks = repo_dir / ".git" / "synthetic-marks"
    stream = _fast_import_stream(commits, branch)
    _git(repo_dir, "fast-import", "--quiet", "--date-format=raw", f"--export-marks={marks}", stdin=stream)
    by_mark = dict(line.split() for line in marks.read_text().splitlines())
    marks.unlink()
    _git(repo_dir, "reset", "-q", "--hard", branch)
    return [by_mark[f":{i + 1}"] for i in range(len(commits))]


def _fast_import_stream(commits: Sequence[SyntheticCommit], branch: str) -> bytes:
    out: list[bytes] = []
    for i, commit in enumerate(commits):
        parents = commit.parents if commit.parents is not None else ([i - 1] if i else [])
        if any(not 0 <= p < i for p in parents):
            raise ValueError(f"commit {i} ({commit.message!r}): parents must be earlier commits")
        who = f"{AUTHOR} {EPOCH + 60 * i} +0000"
        out.append(f"commit refs/heads/{branch}\nmark :{i + 1}\nauthor {who}\ncommitter {who}\n".encode())
        out.append(_data(commit.message.encode()))
        if parents:
            out.append(f"from :{parents[0] + 1}\n".encode())
        else:
            out.append(b"from 0000000000000000000000000000000000000000\n")  # a root, even mid-stream
        out.extend(f"merge :{p + 1}\n".encode() for p in parents[1:])
        for path, content in commit.files.items():
            if content is None:
                out.append(f"D {path}\n".encode())
            else:
                out.append(f"M 100644 inline {path}\n".encode())
                out.append(_data(content.encode()))
        out.append(b"\n")
    return b"".join(out)


def _data(payload: bytes) -> bytes:
    return b"data %d\n%s\n" % (len(payload), payload)


def _git(cwd: Path, *args: str, stdin: bytes | None = None) -> None:
    subprocess.run(["git", *args], cwd=cwd, input=stdin, check=True, capture_output=True)
