"""Two ops whose second reads a strided slice of what the first wrote, for propagated replay."""
from __future__ import annotations

import torch

import replay

double = replay.op("dataflow_test.double", batch_axes={"x": 0, "out": 0})
left_sum = replay.op("dataflow_test.left_sum", batch_axes={"x": 0, "out": 0})


@double.reference
def double_reference(x: torch.Tensor) -> torch.Tensor:
    return (x.double() * 2).to(x.dtype)


@double.batched
def double_batched(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@left_sum.reference
def left_sum_reference(x: torch.Tensor) -> torch.Tensor:
    return x.double().sum(-1).to(x.dtype)


@left_sum.batched
def left_sum_batched(x: torch.Tensor) -> torch.Tensor:
    return x.sum(-1)
