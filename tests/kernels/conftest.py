"""Kernel tests run each case twice: on CPU in the Triton interpreter, and (marked gpu) on CUDA.

The interpreter is process-wide, so on a GPU machine the CPU twins are skipped and the CUDA
ones run; on a CPU machine the reverse.
"""
from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

DEVICES = [
    pytest.param("cpu", id="cpu", marks=pytest.mark.skipif(HAS_CUDA, reason="interpreter is off on a GPU machine")),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]


@pytest.fixture(params=DEVICES)
def dev(request: pytest.FixtureRequest) -> str:
    return request.param
