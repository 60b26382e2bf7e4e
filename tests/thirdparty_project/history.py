"""tinylib, a Triton kernel library that knows nothing of kernel-replay, with a history: tagged
v1.0, then an off-by-one mask in the autotuned kernel among harmless commits.

    build(path) -> Project (tests/user_project/history.py builds it)
"""
from __future__ import annotations

from pathlib import Path

from user_project import history
from user_project.history import Project

TEMPLATE = Path(__file__).parent / "template"
OFF_BY_ONE = ("tinylib/kernels.py", "mask = cols < n_cols\n", "mask = cols < n_cols - 1\n")
HISTORY = [
    ("docs", "README: say what serve.py does",
     [("README.md", "runs three decode steps", "runs three decode steps and prints a checksum")]),
    ("mask", "scale_rows: mask the tail once", [OFF_BY_ONE]),
    ("changelog", "CHANGELOG: 1.1", [("CHANGELOG.md", None, "# 1.1\n- scale_rows masks its tail once\n")]),
]


def build(path: Path, upto: str | None = None) -> Project:
    return history.build(path, upto, template=TEMPLATE, history=HISTORY)
