"""A tiny-model prefill recorded once for the dataflow tests, with one layer's norm weight past 2.0
(where the planted `rmsnorm_weight_saturates` bug shows), and `--code` swaps undone after each test."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import replay

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the interpreter on CPU (tests/conftest.py)
PLANTED_CALL = 26  # layer 1's ffn rmsnorm: the call whose norm weight holds 3.0


def record_prefill(path: Path, *, big_weight: bool = True) -> Path:
    from replay_kernels.model import TinyLlama

    model = TinyLlama(device=DEVICE)
    if big_weight:
        model.weights.layers[1].ffn_norm[7] = 3.0
    with replay.recording(path):
        model.prefill([1, 5, 9, 33])
    return path


@pytest.fixture(scope="session")
def prefill(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record_prefill(tmp_path_factory.mktemp("dataflow") / "prefill")


@pytest.fixture(autouse=True)
def _kernels_put_back(restore_kernels: None) -> None:
    """Every test here may import an edited copy of the kernels through --code."""
