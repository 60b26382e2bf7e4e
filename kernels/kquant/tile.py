"""How the k-quant GEMV kernel is tiled: the rows a program takes and its K walk (GemvTile), the tiles the
GPU benchmark sweeps, and the one tile_config picks for a call.

The K walk never follows M, which is what keeps batched rows equal to single ones: docs/KERNELS.md
("Determinism and row invariance"); the choices were timed on an H100 (docs/PERFORMANCE.md).
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from replay_kernels import launch
from replay_kernels.ggml_quant import QuantFormat

# x rows a batched program takes at most: each weight read serves them all, but the K loop is
# unrolled over them (8 rows spill registers on sm_90; 4 rows fit: docs/PERFORMANCE.md)
BATCHED_BLOCK_M = 4


class GemvTile(NamedTuple):
    """How the kernel walks a weight: BLOCK_N rows a program, held in row_groups tensors of BLOCK_N / row_groups
    rows; LANES lanes (LANES / 8 super-blocks) a step. On a GPU each row gets its own tensor (row_groups =
    BLOCK_N): a tensor of several rows lets Triton's load coalescing spread them over threads, which some
    Triton versions do, and the FMAs then need every weight moved through shared memory."""
    block_n: int
    lanes: int
    warps: int
    row_groups: int


# the tiles the GPU benchmark sweeps (a test checks row invariance under each)
TILE_CANDIDATES = (GemvTile(4, 32, 1, 4), GemvTile(2, 32, 1, 2), GemvTile(1, 32, 1, 1), GemvTile(2, 64, 2, 2),
                   GemvTile(1, 64, 2, 1))
# weight rows a GPU program takes: a batched program shares each x load among four; a single-vector Q4_K
# one takes two, so that more one-warp programs stream the weight at M = 1, while Q6_K's, with fewer
# instructions a weight, gains more from sharing x (docs/PERFORMANCE.md)
GPU_ROWS_BATCHED = 4
GPU_ROWS_SINGLE = {"Q4_K": 2, "Q6_K": 4}


def tile_config(device: torch.device, fmt: QuantFormat, n: int, nb: int, block_m: int) -> GemvTile:
    """The tile for a call. Its K walk (lanes, warps) comes from the device kind and the weight's shape,
    never from M: it fixes each output's summation order. The rows a program takes may follow block_m,
    since each weight row is its own tensor on a GPU and rows never meet."""
    if device.type == "cpu":  # interpreter: few, wide programs and steps
        return GemvTile(min(1024, launch.next_pow2(n)), 8 * min(16, launch.next_pow2(nb)), 4, 1)
    rows = GPU_ROWS_BATCHED if block_m > 1 else GPU_ROWS_SINGLE[fmt.name]
    return GemvTile(rows, 32, 1, rows)  # one-warp programs, four super-blocks a step
