"""residual_add(x [M, H], residual [M, H]) -> x + residual, added in fp32, stored in x's dtype.

Elementwise: no value depends on another row, so single (one row) and batched (M rows) share
one kernel; each program adds one BLOCK-wide slice of one row.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import replay
from replay_kernels import launch
from replay.tolerance import ELEMENTWISE

residual_add = replay.op(
    "residual_add",
    batch_axes={"x": 0, "residual": 0, "out": 0},
    tolerance=ELEMENTWISE,
    doc="out = x + residual, computed in fp32.",
    kernel_rules=replay.KernelRules(row_axis="x"),
)


@triton.jit
def _residual_add_kernel(x_ptr, r_ptr, out_ptr, H, stride_x, stride_r, stride_out,
                         BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask).to(tl.float32)
    r = tl.load(r_ptr + row * stride_r + cols, mask=mask).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (x + r).to(out_ptr.dtype.element_ty), mask=mask)


@residual_add.reference
def residual_add_reference(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    return (x.double() + residual.double()).to(x.dtype)


@residual_add.single_and_batched
def residual_add_rows(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """x + residual for [M, H] rows (the single variant is M = 1)."""
    return launch.elementwise_rows("residual_add", _residual_add_kernel, x=x, residual=residual)
