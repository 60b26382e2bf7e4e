"""Test configuration: the Triton interpreter on CPU when there is no GPU."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton

HAS_CUDA = torch.cuda.is_available()
pytest_plugins = ["kernel_copies"]  # restore_kernels, for tests that import an edited copy through --code


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marker, why = ("interpreter", "launches Triton on host memory: its GPU twin runs here") if HAS_CUDA else \
        ("gpu", "needs a CUDA device; its CPU twin runs in the interpreter")
    skip = pytest.mark.skip(reason=why)
    for item in items:
        if marker in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def said(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    """What kernel-replay has reported through logging since the last call, one message a line:
    what a program's stderr shows when nothing else is configured, and the CLI prints."""
    caplog.set_level(logging.WARNING, logger="replay")

    def messages() -> list[str]:
        lines = [record.getMessage() for record in caplog.records if record.name.startswith("replay")]
        caplog.clear()
        return lines
    return messages


@pytest.fixture(scope="session")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a fresh virtual environment that sees torch, safetensors, triton and numpy (this
    environment's site-packages, by path) but not kernel-replay (its editable install is not run)."""
    env = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = next((env / "lib").glob("python*/site-packages"))
    (site / "dependencies.pth").write_text("\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n")
    python = env / "bin" / "python"
    absent = subprocess.run([str(python), "-c", "import replay"], capture_output=True, cwd=env)
    assert absent.returncode != 0 and b"No module named 'replay'" in absent.stderr, \
        "kernel-replay is importable without its install: is PYTHONPATH naming this tree?"
    return python
