"""Plain `torch.matmul` registered as an op, to show what `replay invariance` finds in a library GEMM
that picks its kernel by M: on a CPU (oneDNN/MKL) and under cuBLAS a row's bits change with the
batch it rides in. Not part of the model (replay_kernels.OPS); no Triton kernel of its own."""
from __future__ import annotations

from typing import Any

import torch

import replay
from replay.tolerance import REDUCTION

torch_matmul = replay.op(
    "torch_matmul",
    batch_axes={"x": 0, "out": 0},
    tolerance=REDUCTION,
    doc="out = x @ weight.T with torch.matmul: x [M, K], weight [N, K].",
)


@torch_matmul.reference
def torch_matmul_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (x.double() @ weight.double().T).to(x.dtype)


@torch_matmul.batched
def torch_matmul_batched(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.matmul(x, weight.T)


@torch_matmul.example()
def torch_matmul_example(rows: int, dtype: torch.dtype, device: str) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(rows)
    # 4096 x 4096: on the H100 (torch 2.11, bf16) cuBLAS gives a row different bits from M = 17 on
    return {"x": torch.randn(rows, 4096, generator=gen).to(device, dtype),
            "weight": torch.randn(4096, 4096, generator=torch.Generator().manual_seed(0)).to(device, dtype) / 64}
