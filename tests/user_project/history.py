"""A user's own project with a history: tagged v1.0, then a bug inside tolerance, a refactor that
breaks a signature for one commit, and a bug outside tolerance, among harmless commits.

    build(path) -> Project: the repository at `path`, and each commit's sha by its role.

build() makes any such project from a template and a history (tests/thirdparty_project/ is another).
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

TEMPLATE = Path(__file__).parent / "template"

# (role, subject, [(file, old, new)]): each edit replaces one exact piece of text
HISTORY = [
    ("docs", "README: say what the block computes",
     [("README.md", "A tiny model", "A tiny model (norm, rotary, scaled residual, softcap)")]),
    ("inside", "norm: fold eps into the kernel",
     [("mymodel/ops.py", "/ H + eps)", "/ H + 1e-5)")]),
    ("harmless", "scaled_add: blocks of 128",
     [("mymodel/ops.py", "triton.cdiv(n, 64),)](x, y, out, n, alpha, BLOCK=64)",
       "triton.cdiv(n, 128),)](x, y, out, n, alpha, BLOCK=128)")]),
    ("signature", "norm: call the epsilon epsilon",
     [("mymodel/ops.py", "def norm_rows(x, weight, eps):", "def norm_rows(x, weight, epsilon):"),
      ("mymodel/ops.py", "x.shape[1], eps, BLOCK", "x.shape[1], epsilon, BLOCK"),
      ("mymodel/model.py", "self.weight, self.eps)", "self.weight, epsilon=self.eps)")]),
    ("signature_fixed", "norm: take eps again, as callers pass it",
     [("mymodel/ops.py", "def norm_rows(x, weight, epsilon):", "def norm_rows(x, weight, eps):"),
      ("mymodel/ops.py", "x.shape[1], epsilon, BLOCK", "x.shape[1], eps, BLOCK"),
      ("mymodel/model.py", "self.weight, epsilon=self.eps)", "self.weight, self.eps)")]),
    ("outside", "rotary: position from the program id, one load fewer",
     [("mymodel/ops.py", "pos = tl.load(pos_ptr + row).to(tl.float32)", "pos = row.to(tl.float32)")]),
    ("changelog", "CHANGELOG: 1.1",
     [("CHANGELOG.md", None, "# 1.1\n- faster norm and rotary\n")]),
]


@dataclass
class Project:
    path: Path
    commits: dict[str, str]  # role -> sha; "v1.0" is the tagged start


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _commit(repo: Path, subject: str) -> str:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=A User", "-c", "user.email=user@example.com", "commit", "-q", "-m", subject)
    return git(repo, "rev-parse", "HEAD")


Edit = tuple[str, "str | None", str]  # (file, old text or None to write it whole, new text)


def build(path: Path, upto: str | None = None, *, template: Path = TEMPLATE,
          history: list[tuple[str, str, list[Edit]]] = HISTORY) -> Project:
    """The project's repository at `path` (which must not exist): `template` committed and tagged
    v1.0, then `history` up to role `upto`."""
    shutil.copytree(template, path, ignore=shutil.ignore_patterns("__pycache__"))
    git(path, "init", "-q")
    commits = {"v1.0": _commit(path, f"{path.name} 1.0")}
    git(path, "tag", "v1.0")
    for role, subject, edits in history:
        for name, old, new in edits:
            file = path / name
            if old is None:
                file.write_text(new)
                continue
            text = file.read_text()
            if text.count(old) != 1:
                raise AssertionError(f"{name}: {old!r} occurs {text.count(old)} times")
            file.write_text(text.replace(old, new))
        commits[role] = _commit(path, subject)
        if role == upto:
            break
    return Project(path, commits)
