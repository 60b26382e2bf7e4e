"""A batch-invariant GEMM: out = x @ weight.T whose every row is the same bits whatever batch it
arrives in, with a backward that keeps the guarantees it can (docs/KERNELS.md, "Batch-invariant GEMM").

What makes a row invariant: one tile shape per device kind, never chosen by M; no split-K; K walked
in BLOCK_K steps in one order, accumulated in fp32 (bf16/fp16 products, no TF32). A row's output
then goes through the same sums whether it is alone or row 37 of 2048.

Backward: dx = dout @ weight is the same GEMM, so its rows are invariant too. dweight =
dout.T @ x reduces over M: it walks M in BLOCK_K chunks in order, so zero rows padded onto the batch
add exact zeros and change nothing; splitting the batch and adding the pieces' dweights does not
give the same bits (a different sum), and cannot.
"""
from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

import replay
from kernels import launch
from replay.tolerance import REDUCTION

SUPPORTED = (torch.bfloat16, torch.float16)
# (BLOCK_M, BLOCK_N, BLOCK_K, warps): fixed per device kind; never a function of M
GPU_TILE = (64, 64, 64, 4)
INTERPRETER_TILE = (16, 32, 32, 1)

det_gemm = replay.op(
    "det_gemm",
    batch_axes={"x": 0, "out": 0},
    tolerance=REDUCTION,
    doc="out = x @ weight.T, bf16/fp16 in, fp32 accumulation, each row independent of the batch "
        "(fixed tile, no split-K).",
    kernel_rules=replay.KernelRules(row_axis="y"),
)


@triton.jit
def _det_gemm_kernel(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr):
    """C[M, N] = A[M, K] @ B[K, N] (any strides): a program per (BLOCK_N columns, BLOCK_M rows)."""
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + rk
        a = tl.load(a_ptr + rm[:, None].to(tl.int64) * stride_am + ks[None, :] * stride_ak,
                    mask=(rm[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + rn[None, :].to(tl.int64) * stride_bn,
                    mask=(ks[:, None] < K) & (rn[None, :] < N), other=0.0)
        if UPCAST:  # the interpreter's dot is wrong on bf16: fp32 products of bf16 values are exact
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc += tl.dot(a, b, input_precision="ieee")
    tl.store(c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn,
             acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """a [M, K] @ b [K, N] (any strides) with the fixed tile; bf16 or fp16 in, fp32 accumulation."""
    device = launch.check_device("det_gemm", a, b)
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in SUPPORTED:
            raise TypeError(f"det_gemm: {name} is {t.dtype}; supported: bfloat16 and float16 (no silent fallback)")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"det_gemm: shapes {tuple(a.shape)} @ {tuple(b.shape)} do not multiply")
    m, k = a.shape
    n = b.shape[1]
    block_m, block_n, block_k, warps = INTERPRETER_TILE if device.type == "cpu" else GPU_TILE
    c = torch.empty((m, n), dtype=out_dtype or a.dtype, device=device)
    launch.run(_det_gemm_kernel, (triton.cdiv(n, block_n), triton.cdiv(m, block_m)), a, b, c, m, n, k,
               a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
               BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, UPCAST=launch.interpreter_active(),
               num_warps=warps)
    return c


class DetLinear(torch.autograd.Function):
    """x @ weight.T with det_gemm forward and backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        return matmul(x, weight.t())

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        x, weight = ctx.saved_tensors
        grad_out = grad_out.to(x.dtype)
        dx = matmul(grad_out, weight) if ctx.needs_input_grad[0] else None
        dw = matmul(grad_out.t(), x) if ctx.needs_input_grad[1] else None  # reduces over M in fixed chunks
        return dx, dw


@det_gemm.single_and_batched
def det_gemm_kernel(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return DetLinear.apply(x, weight)


@det_gemm.reference
def det_gemm_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (x.double() @ weight.double().t()).to(x.dtype)


@det_gemm.example()
def det_gemm_example(rows: int, dtype: torch.dtype, device: str) -> dict[str, Any]:
    dtype = dtype if dtype in SUPPORTED else torch.bfloat16  # the op takes bf16/fp16 only
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
    weight = torch.randn(40, 96, generator=torch.Generator().manual_seed(0)) / 8
    return {"x": x.to(device, dtype), "weight": weight.to(device, dtype)}
