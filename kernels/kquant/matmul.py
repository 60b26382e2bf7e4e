"""x [M, K] @ W^T for W [N, K] stored in ggml Q4_K or Q6_K super-blocks: the host side both GEMV ops call
(check the arguments, allocate the output, pick the tile, launch), and the reference it is checked against.

The kernel is split by job: walk.py (the K walk), q4k.py and q6k.py (a step in each format),
lanes.py (lane layout, x loads), bits.py (exact bit-field reads), tile.py (tile policy). How it
keeps batched rows bit for bit equal to single ones: docs/KERNELS.md ("Determinism and row invariance").
"""
from __future__ import annotations

import torch
import triton

import replay
from replay_kernels import launch
from replay_kernels.ggml_quant import DEQUANTIZERS, QK_K, Q4_K, QuantFormat, columns_of
from replay_kernels.kquant.bits import E23
from replay_kernels.kquant.tile import BATCHED_BLOCK_M, TILE_CANDIDATES, GemvTile, tile_config
from replay_kernels.kquant.walk import _kquant_matmul_kernel

# the tile policy's names stay importable from here, where the GEMV ops, tests and scripts look for them
__all__ = ["BATCHED_BLOCK_M", "TILE_CANDIDATES", "GemvTile", "dequant_matmul_reference", "kquant_matmul",
           "tile_config"]


def _aligned(t: torch.Tensor, row_multiple: int) -> torch.Tensor:
    """t, copied if the kernel's aligned word loads cannot reach it as it lies: its first byte must sit on a
    4-byte boundary, and its rows row_multiple elements apart."""
    if t.data_ptr() % 4 or t.stride(0) % row_multiple:
        return t.clone(memory_format=torch.contiguous_format)
    return t


def kquant_matmul(x: torch.Tensor, weight: torch.Tensor, fmt: QuantFormat, *, block_m: int,
                  config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """x [M, K] (fp32/fp16/bf16) times the quantised weight [N, K] transposed -> [M, N] in x's dtype.

    `block_m`: the x rows a program takes at most (1: single; BATCHED_BLOCK_M: batched). `config`
    (a GemvTile) overrides `tile_config`: for tuning sweeps only, since the variants' row invariance
    relies on every call with a weight walking K the same way.
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
    if m == 0 or n == 0:
        return out
    # weight rows on 4-byte (Q4_K) or 2-byte (Q6_K: 210-byte blocks) boundaries; bf16 x read a word (two) at a time
    weight = _aligned(weight, 4 if fmt == Q4_K else 2)
    if x.dtype == torch.bfloat16:
        x = _aligned(x, 2)
    tile = GemvTile(*config) if config is not None else tile_config(x.device, fmt, n, nb, block_m)
    block_m = min(block_m, launch.next_pow2(m))  # no program takes more rows than there are
    replay.launch(_kquant_matmul_kernel, (triton.cdiv(n, tile.block_n), triton.cdiv(m, block_m)),
               x, weight, out, m, n, nb, x.stride(0), out.stride(0), weight.stride(0), E23,
               Q4K=fmt == Q4_K, LANES=tile.lanes, BLOCK_M=block_m, BLOCK_N=tile.block_n, ROW_GROUPS=tile.row_groups,
               num_warps=tile.warps)
    return out


def dequant_matmul_reference(x: torch.Tensor, weight: torch.Tensor, fmt: QuantFormat) -> torch.Tensor:
    """ggml's dequantisation, then an fp32 matmul, rounded once to x's dtype."""
    w = DEQUANTIZERS[fmt.name](weight)
    return (x.float() @ w.T).to(x.dtype)
