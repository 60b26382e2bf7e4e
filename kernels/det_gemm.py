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

from typing import Any, NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import replay
from replay_kernels import launch
from replay.tolerance import REDUCTION

SUPPORTED = (torch.bfloat16, torch.float16)


class Tile(NamedTuple):
    """A launch shape: fixed per device kind, never a function of M (the row count)."""
    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    group_m: int  # row tiles walked together, so that a weight tile read into L2 serves them all


# the fastest fixed tile at M >= 1024 on the H100 (scripts/bench_det_gemm.py, docs/PERFORMANCE.md)
GPU_TILE = Tile(128, 256, 64, 8, 3, 4)
INTERPRETER_TILE = Tile(16, 32, 32, 1, 1, 2)
INTERPRETER_PROGRAMS = 3  # the interpreter runs programs one by one: a few exercise the persistent loop

det_gemm = replay.op(
    "det_gemm",
    batch_axes={"x": 0, "out": 0},
    tolerance=REDUCTION,
    doc="out = x @ weight.T, bf16/fp16 in, fp32 accumulation, each row independent of the batch "
        "(fixed tile, no split-K).",
    # no row axis: a persistent grid of one program per SM walks the tiles, rows among them
    kernel_rules=replay.KernelRules(),
)


@triton.jit
def program_tile(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(row tile, column tile) of linear tile number `tile`, walking GROUP_M row tiles at a time
    across every column tile; which program takes a tile changes no value in it."""
    group_first = (tile // (GROUP_M * tiles_n)) * GROUP_M
    group_rows = tl.minimum(tiles_m - group_first, GROUP_M)
    in_group = tile % (GROUP_M * tiles_n)
    return group_first + in_group % group_rows, in_group // group_rows


# any M runs the one compiled kernel: Triton would otherwise compile another for M == 1 or M % 16 == 0
@triton.jit(do_not_specialize=["M"])
def _det_gemm_kernel(a_desc, b_desc, c_desc, M, N, K, A_T: tl.constexpr, B_T: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr,
                     UPCAST: tl.constexpr):
    """C[M, N] = A[M, K] @ B[K, N], persistent: program p takes tiles p, p + PROGRAMS, ... Operands
    arrive through tensor descriptors (TMA on Hopper), A stored [M, K] or, with A_T, [K, M]; B stored
    [K, N] or, with B_T, [N, K]; rows and columns past the edges read as zeros and are not written."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, PROGRAMS, flatten=True):
        pid_m, pid_n = program_tile(tile, tiles_m, tiles_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            a = a_desc.load([k0, pid_m * BLOCK_M]).T if A_T else a_desc.load([pid_m * BLOCK_M, k0])
            b = b_desc.load([pid_n * BLOCK_N, k0]).T if B_T else b_desc.load([k0, pid_n * BLOCK_N])
            if UPCAST:  # the interpreter's dot is wrong on bf16: fp32 products of bf16 values are exact
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision="ieee")
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))


def _rows_aligned(t: torch.Tensor) -> bool:
    """Row-major with every row starting on 16 bytes, as the tensor-memory copies need."""
    return t.stride(1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0


def _descriptor(name: str, t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """A descriptor over `t` read row-major; a row-major copy first where `t` is not aligned so."""
    if not _rows_aligned(t):
        t = t.clone(memory_format=torch.contiguous_format)
    if not _rows_aligned(t):
        raise ValueError(f"det_gemm: {name}'s rows of {t.shape[1]} values are not a multiple of 16 bytes, which the "
                         f"tensor-memory copies need (a multiple of 8 bf16/fp16 values)")
    return TensorDescriptor.from_tensor(t, block)


def _operand(name: str, t: torch.Tensor, rows: int, cols: int) -> tuple[TensorDescriptor, bool]:
    """A descriptor of `t` [outer, inner] with (rows, cols) tiles, and whether it was taken over
    t.T: a tensor stored inner-major is read as it lies when its rows align, else copied."""
    if t.stride(0) == 1 and t.stride(1) != 1 and _rows_aligned(t.t()):
        return _descriptor(name, t.t(), [cols, rows]), True
    return _descriptor(name, t, [rows, cols]), False


def matmul(a: torch.Tensor, b: torch.Tensor, tile: Tile | None = None) -> torch.Tensor:
    """a [M, K] @ b [K, N] (either stored row- or column-major) with the device's fixed tile (`tile`
    only for benchmarks); bf16 or fp16 in, fp32 accumulation."""
    device = launch.check_device("det_gemm", a, b)
    for name, t in (("a", a), ("b", b)):
        if t.dtype not in SUPPORTED:
            raise TypeError(f"det_gemm: {name} is {t.dtype}; supported: bfloat16 and float16 (no silent fallback)")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"det_gemm: shapes {tuple(a.shape)} @ {tuple(b.shape)} do not multiply")
    m, k = a.shape
    n = b.shape[1]
    cpu = device.type == "cpu"
    tile = tile or (INTERPRETER_TILE if cpu else GPU_TILE)
    a_desc, a_t = _operand("a", a, tile.block_m, tile.block_k)
    b_desc, b_t = _operand("b", b.t(), tile.block_n, tile.block_k)
    c = torch.empty((m, n), dtype=a.dtype, device=device)
    c_desc = _descriptor("out", c, [tile.block_m, tile.block_n])
    programs = INTERPRETER_PROGRAMS if cpu else torch.cuda.get_device_properties(device).multi_processor_count
    replay.launch(_det_gemm_kernel, (programs,), a_desc, b_desc, c_desc, m, n, k, A_T=a_t, B_T=not b_t,
               BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, GROUP_M=tile.group_m,
               PROGRAMS=programs, UPCAST=launch.interpreter_active(), num_warps=tile.warps, num_stages=tile.stages)
    return c


def error_bound(x: torch.Tensor, weight: torch.Tensor, ulps: float = 0.5) -> torch.Tensor:
    """Elementwise bound on |x @ weight.T by det_gemm - the exact product| (docs/KERNELS.md): the K
    products of bf16/fp16 values are exact in fp32; summing them costs at most K * 2^-23 of
    sum |x||w| (fp32 additions that may truncate, as tensor cores do); the final rounding to x's
    dtype `ulps` of its spacing (0.5: round to nearest; the interpreter truncates: 1)."""
    k, fraction = x.shape[1], torch.finfo(x.dtype).eps  # the spacing of values in [1, 2)
    exact = x.double() @ weight.double().t()
    accumulation = k * 2.0 ** -23 * (x.double().abs() @ weight.double().abs().t())
    subnormal_spacing = torch.finfo(x.dtype).smallest_normal * fraction
    return accumulation + ulps * (fraction * (exact.abs() + accumulation) + subnormal_spacing)


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
