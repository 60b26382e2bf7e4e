"""Where a lane of the k-quant GEMV sits, and the x values it multiplies; shared by both formats' steps.

LANES lanes walk K, eight to a super-block; lane v of a super-block owns the 32 weights under its 16-byte
share of the quant bytes. docs/KERNELS.md ("Determinism and row invariance") has the whole layout.
"""
from __future__ import annotations

import triton
import triton.language as tl

from replay_kernels.kquant.bits import _load


@triton.jit
def _lane(LANES: tl.constexpr):
    """Lane u's super-block (of the step's LANES / 8) and its place v (0..7) in it."""
    u = tl.arange(0, LANES)
    return u // 8, u % 8


@triton.jit
def _x8(x_row, cols, ok, TAIL: tl.constexpr):
    """fp32 x[cols + j] and x[cols + 4 + j] for cols [L] as two [1, L, 4] tensors (slot j): one 16-byte
    load a lane for bf16 and fp16. bf16 is widened by hand, a word (two values) at a time: one shift or
    mask a value, where the compiler's conversion of the high half costs two."""
    if x_row.dtype.element_ty == tl.bfloat16:  # the launcher keeps bf16 rows 4-byte aligned
        words = _load(x_row.to(tl.pointer_type(tl.int32)) + (cols // 2)[None, :, None] + tl.arange(0, 4)[None, None, :],
                      ok[:, :, None], TAIL)
        even = (words << 16).to(tl.float32, bitcast=True)
        odd = (words & -65536).to(tl.float32, bitcast=True)
        x = tl.reshape(tl.join(even, odd), (1, cols.shape[0], 8))
    else:
        x = _load(x_row + cols[None, :, None] + tl.arange(0, 8)[None, None, :], ok[:, :, None], TAIL).to(tl.float32)
    return tl.split(tl.permute(tl.reshape(x, (1, x.shape[1], 2, 4)), (0, 1, 3, 2)))


@triton.jit
def _x_rows(x_rows, cols, HIGH: tl.constexpr, ok, BLOCK_M: tl.constexpr, TAIL: tl.constexpr):
    """For each x row, x under a pair of quant words: columns cols .. cols + 7 (the low weights') and
    cols + HIGH .. cols + HIGH + 7 (the high ones'), as four [1, L, 4] tensors: low word 0, low word 1,
    high word 0, high word 1."""
    xs = ()
    for r in tl.static_range(BLOCK_M):
        xs = xs + (_x8(x_rows[r], cols, ok, TAIL) + _x8(x_rows[r], cols + HIGH, ok, TAIL),)
    return xs
