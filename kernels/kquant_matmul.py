"""x [M, K] @ W^T for W [N, K] stored in ggml Q4_K or Q6_K super-blocks; shared by both GEMV ops.

One kernel serves the single-vector GEMV (BLOCK_M = 1) and the small-M batched GEMM
(BLOCK_M = 8). A program owns BLOCK_N weight rows and walks K a fixed KB super-blocks at a
time. Each step dequantises its weight tile once, bit-exactly as ggml does (the products
d*scale and scale*q are formed in fp32 like dequantize_row_q4_K/q6_K), then, for each of its
x rows in turn, reduces tile * x_row to one partial per weight row and adds it to that row's
fp32 accumulator.

Row invariance by construction: a row's partial is the same tensor expression on the same
tile whatever BLOCK_M is and whichever rows ride along, the K walk is fixed by (N, K) alone
(`tile_config`), and rows past M are skipped, not computed. So batched row r == single(row r)
to the bit, on CPU (interpreter) and GPU.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import launch
from kernels.ggml_quant import DEQUANTIZERS, QK_K, Q4_K, QuantFormat, columns_of

BATCHED_BLOCK_M = 8


@triton.jit
def _fp16_at(w_ptr, offsets, mask):
    """fp32 value of the little-endian fp16 stored at byte `offsets` (only 2-byte aligned)."""
    lo = tl.load(w_ptr + offsets, mask=mask, other=0).to(tl.int32)
    hi = tl.load(w_ptr + offsets + 1, mask=mask, other=0).to(tl.int32)
    return (lo | (hi << 8)).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _small_uint_to_f32(q, bias: tl.constexpr):
    """Exact float(q) - bias for 0 <= q < 2^23: OR into the mantissa of 2^23, subtract.

    Cheaper on a GPU than an int-to-float conversion instruction.
    """
    return (q | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + bias)


@triton.jit
def _q4k_scaled(w_ptr, blk, j, valid):
    """ggml's d * scale_j and dmin * min_j for sub-blocks j [U] of blocks at byte offsets blk [BN, U].

    get_scale_min_k4: the 6-bit scale and min of sub-block j are split over three of the 12 bytes.
    """
    low = (j < 4)[None, :]
    a = tl.load(w_ptr + blk + 4 + tl.where(j < 4, j, j + 4)[None, :], mask=valid, other=0).to(tl.int32)
    b = tl.load(w_ptr + blk + 4 + tl.where(j < 4, j + 4, j - 4)[None, :], mask=valid, other=0).to(tl.int32)
    c = tl.load(w_ptr + blk + 4 + j[None, :], mask=valid, other=0).to(tl.int32)
    sc = tl.where(low, a & 63, (a & 15) | ((b >> 6) << 4))
    mn = tl.where(low, b & 63, (a >> 4) | ((c >> 6) << 4))
    d1 = _fp16_at(w_ptr, blk, valid) * _small_uint_to_f32(sc, 0.0)
    m1 = _fp16_at(w_ptr, blk + 2, valid) * _small_uint_to_f32(mn, 0.0)
    return d1[:, :, None], m1[:, :, None]


@triton.jit
def _q4k_tile(w_ptr, row_off, row_mask, kb0, nb, KB: tl.constexpr):
    """Weights of super-blocks kb0..kb0+KB-1 as two fp32 tiles [BLOCK_N, KB*4, 32].

    Unit u is 32-byte chunk c = u % 4 of super-block kb0 + u // 4; its low nibbles are
    sub-block 2c (tile 0, weights 64c + l), its high nibbles sub-block 2c+1 (tile 1, + 32).
    """
    u = tl.arange(0, KB * 4)
    kb = kb0 + u // 4
    c = u % 4
    blk = row_off[:, None] + kb[None, :] * 144  # [BN, U] byte offset of the super-block
    valid = row_mask[:, None] & (kb < nb)[None, :]
    q_off = blk[:, :, None] + (16 + c * 32)[None, :, None] + tl.arange(0, 32)[None, None, :]
    byte = tl.load(w_ptr + q_off, mask=valid[:, :, None], other=0).to(tl.int32)
    d_lo, m_lo = _q4k_scaled(w_ptr, blk, 2 * c, valid)
    d_hi, m_hi = _q4k_scaled(w_ptr, blk, 2 * c + 1, valid)
    w_lo = d_lo * _small_uint_to_f32(byte & 15, 0.0) - m_lo
    w_hi = d_hi * _small_uint_to_f32(byte >> 4, 0.0) - m_hi
    return w_lo, w_hi


@triton.jit
def _q6k_scale(w_ptr, blk, index, valid, WRONG_SCALE: tl.constexpr):
    """int8 scales[index] as fp32 [BN, U] for scale indices [U] of blocks at byte offsets blk [BN, U]."""
    if WRONG_SCALE:  # planted bug "q6k_scale_index"
        index = tl.where(index == 15, 14, index)
    sc = tl.load(w_ptr + blk + 192 + index[None, :], mask=valid, other=0).to(tl.int8, bitcast=True)
    return sc.to(tl.float32)


@triton.jit
def _q6k_tile(w_ptr, row_off, row_mask, kb0, nb, KB: tl.constexpr, WRONG_SCALE: tl.constexpr):
    """Weights of super-blocks kb0..kb0+KB-1 as four fp32 tiles [BLOCK_N, KB*4, 16], one per quarter g.

    Unit u is lanes 16h..16h+15 (h = u % 2) of half n = (u % 4) // 2 of super-block kb0 + u // 4.
    Weight 128n + 32g + l keeps its low 4 bits in ql[64n + 32(g % 2) + l] (the high nibble
    when g >= 2), its top 2 bits in qh[32n + l] >> 2g, and uses scale 8n + 2g + l // 16.
    """
    u = tl.arange(0, KB * 4)
    kb = kb0 + u // 4
    n = (u % 4) // 2
    h = u % 2
    blk = row_off[:, None] + kb[None, :] * 210
    valid = row_mask[:, None] & (kb < nb)[None, :]
    lane = (h * 16)[:, None] + tl.arange(0, 16)[None, :]  # [U, 16]
    base = w_ptr + blk[:, :, None]
    mask = valid[:, :, None]
    ql_a = tl.load(base + ((n * 64)[:, None] + lane)[None, :, :], mask=mask, other=0).to(tl.int32)
    ql_b = tl.load(base + ((n * 64 + 32)[:, None] + lane)[None, :, :], mask=mask, other=0).to(tl.int32)
    qh = tl.load(base + ((128 + n * 32)[:, None] + lane)[None, :, :], mask=mask, other=0).to(tl.int32)
    d = _fp16_at(w_ptr, blk + 208, valid)
    first = n * 8 + h
    # ggml's d * sc[is], then times (q - 32)
    d0 = (d * _q6k_scale(w_ptr, blk, first, valid, WRONG_SCALE))[:, :, None]
    d1 = (d * _q6k_scale(w_ptr, blk, first + 2, valid, WRONG_SCALE))[:, :, None]
    d2 = (d * _q6k_scale(w_ptr, blk, first + 4, valid, WRONG_SCALE))[:, :, None]
    d3 = (d * _q6k_scale(w_ptr, blk, first + 6, valid, WRONG_SCALE))[:, :, None]
    w0 = d0 * _small_uint_to_f32((ql_a & 15) | ((qh & 3) << 4), 32.0)
    w1 = d1 * _small_uint_to_f32((ql_b & 15) | (((qh >> 2) & 3) << 4), 32.0)
    w2 = d2 * _small_uint_to_f32((ql_a >> 4) | (((qh >> 4) & 3) << 4), 32.0)
    w3 = d3 * _small_uint_to_f32((ql_b >> 4) | ((qh >> 6) << 4), 32.0)
    return w0, w1, w2, w3


@triton.jit
def _kquant_matmul_kernel(x_ptr, w_ptr, out_ptr, M, N, nb, stride_xm, stride_om, row_bytes,
                          Q4K: tl.constexpr, SUB: tl.constexpr, KB: tl.constexpr, STAGES: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WRONG_SCALE: tl.constexpr):
    pid_n = tl.program_id(0)
    first_m = tl.program_id(1) * BLOCK_M
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    row_off = rows.to(tl.int64) * row_bytes
    slot = tl.arange(0, BLOCK_M)
    K = nb * 256
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # column of x under tile element (unit u, lane) of tile 0; tile p sits 32 p columns further
    u = tl.arange(0, KB * 4)
    if Q4K:
        unit_cols = (u // 4) * 256 + (u % 4) * 64
    else:
        unit_cols = (u // 4) * 256 + ((u % 4) // 2) * 128 + (u % 2) * 16
    unit_cols = unit_cols[:, None] + tl.arange(0, SUB)[None, :]
    for kb0 in tl.range(0, nb, KB, num_stages=STAGES):
        cols = kb0 * 256 + unit_cols
        if Q4K:
            w0, w1 = _q4k_tile(w_ptr, row_off, row_mask, kb0, nb, KB)
        else:
            w0, w1, w2, w3 = _q6k_tile(w_ptr, row_off, row_mask, kb0, nb, KB, WRONG_SCALE)
        for r in tl.static_range(BLOCK_M):
            if first_m + r < M:
                x = x_ptr + (first_m + r).to(tl.int64) * stride_xm + cols
                x0 = tl.load(x, mask=cols < K, other=0.0).to(tl.float32)
                x1 = tl.load(x + 32, mask=cols + 32 < K, other=0.0).to(tl.float32)
                prod = w0 * x0[None, :, :] + w1 * x1[None, :, :]
                if not Q4K:
                    x2 = tl.load(x + 64, mask=cols + 64 < K, other=0.0).to(tl.float32)
                    x3 = tl.load(x + 96, mask=cols + 96 < K, other=0.0).to(tl.float32)
                    prod += w2 * x2[None, :, :] + w3 * x3[None, :, :]
                partial = tl.sum(tl.sum(prod, axis=2), axis=1)
                acc = tl.where(slot[:, None] == r, acc + partial[None, :], acc)
    m = first_m + slot
    out = out_ptr + m.to(tl.int64)[:, None] * stride_om + rows[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(m < M)[:, None] & row_mask[None, :])


# (BLOCK_N, KB, num_warps, num_stages) the GPU benchmark sweeps; tile_config picks among them
TILE_CANDIDATES = ((2, 4, 1, 1), (4, 2, 1, 3), (4, 4, 2, 1), (8, 2, 2, 1), (8, 4, 4, 1), (16, 2, 4, 1))


def tile_config(device: torch.device, n: int, nb: int) -> tuple[int, int, int, int]:
    """(BLOCK_N, KB, num_warps, num_stages) from the device kind and the weight's shape, never from M.

    The K walk (KB super-blocks a step) fixes each output's summation order, so it must not
    depend on how many rows arrive together.
    """
    if device.type == "cpu":  # interpreter: few large programs
        return min(256, launch.next_pow2(n)), min(2, nb), 4, 1
    # one-warp programs over two weight rows, four super-blocks a step: the fastest candidate
    # for both formats at M = 1 and M = 8 on an H100 (docs/PERFORMANCE.md)
    return 2, min(4, launch.next_pow2(nb)), 1, 1


def kquant_matmul(x: torch.Tensor, weight: torch.Tensor, fmt: QuantFormat, *, block_m: int,
                  wrong_scale: bool = False, config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """x [M, K] (fp32/fp16/bf16) times the quantised weight [N, K] transposed -> [M, N] in x's dtype.

    `config` (BLOCK_N, KB, num_warps, num_stages) overrides `tile_config`: for tuning sweeps only, since
    the variants' row invariance relies on every call with a weight using the same one.
    """
    op = f"{fmt.name.lower().replace('_', '')}_gemv"
    launch.check_device(op, x, weight)
    k = columns_of(weight, fmt)
    if x.dim() != 2 or x.shape[1] != k or x.stride(1) != 1:
        raise ValueError(f"{op}: x must be [M, K={k}] with contiguous rows, got {tuple(x.shape)} "
                         f"strides {x.stride()}")
    if weight.stride(1) != 1:
        raise ValueError(f"{op}: weight rows must be contiguous bytes, strides {weight.stride()}")
    m, n, nb = x.shape[0], weight.shape[0], k // QK_K
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_n, kb, warps, stages = config or tile_config(x.device, n, nb)
    launch.run(_kquant_matmul_kernel, (triton.cdiv(n, block_n), triton.cdiv(m, block_m)),
               x, weight, out, m, n, nb, x.stride(0), out.stride(0), weight.stride(0),
               Q4K=fmt is Q4_K, SUB=fmt.sub_block, KB=kb, STAGES=stages, BLOCK_M=block_m, BLOCK_N=block_n,
               WRONG_SCALE=wrong_scale, num_warps=warps)
    return out


def dequant_matmul_reference(x: torch.Tensor, weight: torch.Tensor, fmt: QuantFormat) -> torch.Tensor:
    """ggml's dequantisation, then an fp32 matmul, rounded once to x's dtype."""
    w = DEQUANTIZERS[fmt.name](weight)
    return (x.float() @ w.T).to(x.dtype)
