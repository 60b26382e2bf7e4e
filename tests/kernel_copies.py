"""Copies of the bundled kernels with one edit planted, for `--code DIR`, and the fixture that puts
the installed kernels back after a command imported a copy in this process."""
from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path
from typing import Iterator

import pytest

from replay import registry

KERNELS = Path(__file__).resolve().parent.parent / "kernels"
RMSNORM_MEAN_OVER_H_PLUS_1 = ("rmsnorm.py", "tl.sum(x * x, axis=0) / H + eps", "tl.sum(x * x, axis=0) / (H + 1) + eps")
RMSNORM_WEIGHT_SATURATES = ("rmsnorm.py", "    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)\n",
                            "    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)\n"
                            "    w = tl.minimum(w, 2.0)\n")


def edited_kernels(tmp_path: Path, edit: tuple[str, str, str], name: str = "code") -> Path:
    """A directory holding `replay_kernels` with `edit` (file, old, new) made once."""
    code = tmp_path / name
    shutil.copytree(KERNELS, code / "replay_kernels", ignore=shutil.ignore_patterns("__pycache__"))
    source = code / "replay_kernels" / edit[0]
    text = source.read_text()
    assert text.count(edit[1]) == 1, edit[1]
    source.write_text(text.replace(edit[1], edit[2]))
    return code


@contextlib.contextmanager
def kernels_put_back() -> Iterator[None]:
    """`--code DIR` imports the kernels again from DIR in this process; put the installed ones back."""
    ops, path = dict(registry._OPS), list(sys.path)
    modules = {name: module for name, module in sys.modules.items() if name.startswith("replay_kernels")}
    try:
        yield
    finally:
        registry._OPS.clear()
        registry._OPS.update(ops)
        sys.path[:] = path
        for name in [n for n in sys.modules if n.startswith("replay_kernels")]:
            del sys.modules[name]
        sys.modules.update(modules)


@pytest.fixture
def restore_kernels() -> Iterator[None]:
    with kernels_put_back():
        yield
