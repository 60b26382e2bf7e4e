"""rmsnorm(x [M, H], weight [H], eps) -> x / sqrt(mean(x^2) + eps) * weight, in x's dtype.

One program normalises one whole row in registers (a single read, a single write), with the
sum of squares accumulated in fp32. A row's reduction never depends on the other rows, so the
single variant (one row) and the batched variant (M rows) run the same kernel, one program
a row, and agree to the bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import replay
from replay_kernels import launch
from replay.tolerance import ELEMENTWISE

rmsnorm = replay.op(
    "rmsnorm",
    batch_axes={"x": 0, "out": 0, "rstd": 0},
    tolerance=ELEMENTWISE,
    doc="out = x * rsqrt(mean(x^2, -1) + eps) * weight; fp32 accumulation; tag 'rstd' [M] fp32.",
    kernel_rules=replay.KernelRules(row_axis="x"),
)

MAX_ROW = 65536  # a row lives in one program's registers


@triton.jit
def _rmsnorm_rows_kernel(x_ptr, w_ptr, out_ptr, rstd_ptr, H, stride_x, stride_out, eps,
                         BLOCK_H: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    mask = cols < H
    x = tl.load(x_ptr + row.to(tl.int64) * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * rstd * w
    tl.store(out_ptr + row.to(tl.int64) * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(rstd_ptr + row, rstd)


@rmsnorm.single_and_batched
def rmsnorm_rows(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [M, H] normalised row by row, one program a row (the single variant is M = 1)."""
    launch.check_device("rmsnorm", x, weight)
    launch.check_last_dim_contiguous("rmsnorm", x=x, weight=weight)
    m, h = x.shape
    if h > MAX_ROW or weight.shape != (h,):
        raise ValueError(f"rmsnorm: x [M, H<={MAX_ROW}] and weight [H] expected, "
                         f"got {tuple(x.shape)} and {tuple(weight.shape)}")
    out = torch.empty_like(x)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    block = launch.next_pow2(h)
    replay.launch(_rmsnorm_rows_kernel, (m,), x, weight, out, rstd, h, x.stride(0), out.stride(0), eps,
               BLOCK_H=block, num_warps=launch.warps_for(block))
    replay.tag("rstd", rstd)
    return out


@rmsnorm.reference
def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x64 = x.double()
    rstd = torch.rsqrt(x64.pow(2).mean(-1) + eps)
    replay.tag("rstd", rstd.float())
    return (x64 * rstd[:, None] * weight.double()).to(x.dtype)
