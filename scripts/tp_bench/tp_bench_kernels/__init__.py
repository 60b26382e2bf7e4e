"""The Triton kernels of scripts/bench_ranks.py's tensor-parallel MLP step: a tiled matmul and a
position term read from position_buf (the runtime state the host moves on each step)."""
import torch
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rows = tl.program_id(0) * BM + tl.arange(0, BM)
    cols = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rows[:, None] * K + ks[None, :], mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * N + cols[None, :], mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    tl.store(c_ptr + rows[:, None] * N + cols[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit
def add_position_kernel(x_ptr, position_buf, out_ptr, H, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    position = tl.load(position_buf + row).to(tl.float32)
    x = tl.load(x_ptr + row * H + cols, mask=cols < H, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * H + cols, (x + 1e-3 * position).to(out_ptr.dtype.element_ty), mask=cols < H)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=a.dtype)
    grid = (triton.cdiv(a.shape[0], 64), triton.cdiv(b.shape[1], 64))
    matmul_kernel[grid](a, b, c, a.shape[0], b.shape[1], a.shape[1], BM=64, BN=64, BK=64)
    return c


def add_position(x: torch.Tensor, position_buf: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    add_position_kernel[(x.shape[0], triton.cdiv(x.shape[1], 1024))](x, position_buf, out, x.shape[1], BLOCK=1024)
    return out
