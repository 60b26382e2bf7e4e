"""One step of the GEMV's K walk over a Q4_K weight: load a lane's words, turn them into ggml's fp32 weights
bit for bit, and fold those into the running sums with x (weights first, then x).

Why weights first for Q4_K, and the lane layout: docs/KERNELS.md ("Determinism and row invariance").
"""
from __future__ import annotations

import triton
import triton.language as tl

from replay_kernels.kquant.bits import _bytes_in_place, _field, _fp16_low, _in_place_scale, _load4
from replay_kernels.kquant.lanes import _lane, _x_rows

# slots of a row group's tuple from _q4k_load: the super-block header (the d | dmin word, then the 12 scale
# bytes in three words), then the lane's four quant words
Q4K_D_DMIN = tl.constexpr(0)
Q4K_SCALES = tl.constexpr(1)  # words 1 .. 3
Q4K_QUANTS = tl.constexpr(4)  # words 4 .. 7


@triton.jit
def _q4k_load(wrow, kb0, nb, LANES: tl.constexpr):
    """The words lane (s, v) needs: the header (d | dmin, 12 scale bytes) and quant bytes 16v .. 16v + 15 of
    super-block kb0 + s, clamped to the last super-block (the step masks x there). The eight lanes of a
    super-block read its 128 quant bytes side by side: one 512-byte run of four blocks a warp load."""
    s, v = _lane(LANES)
    kb = tl.minimum(kb0 + s, nb - 1)
    blk = wrow + (kb * 36)[None, :]  # [R, L] int32 pointers: 144-byte blocks, 16-byte aligned
    return _load4(blk) + _load4(blk + (4 + v * 4)[None, :])


@triton.jit
def _q4k_scales(loaded, c, e23):
    """(d_lo, m_lo, d_hi, m_hi): what turns lane (s, v)'s low nibbles (sub-block 2c) and high nibbles
    (sub-block 2c + 1), read in place, into ggml's weights (see _q4k_weights)."""
    d_dmin = loaded[Q4K_D_DMIN]
    s0, s1, s2 = loaded[Q4K_SCALES], loaded[Q4K_SCALES + 1], loaded[Q4K_SCALES + 2]
    # get_scale_min_k4 of sub-blocks 2c and 2c + 1: their bytes sit side by side at bit 16 (c % 2)
    sh = ((c % 2) * 16)[None, :]
    a0 = s0 >> sh
    a1 = s1 >> sh
    a2 = s2 >> sh
    low = (c < 2)[None, :]
    sc = tl.where(low, a0 & 0x3F3F, (a2 & 0x0F0F) | ((a0 >> 2) & 0x3030))
    mn = tl.where(low, a1 & 0x3F3F, ((a2 >> 4) & 0x0F0F) | ((a1 >> 2) & 0x3030))
    d = _fp16_low(d_dmin)
    dmin = _fp16_low(d_dmin >> 16)
    # ggml's d * scale and dmin * min (exact products), and d scaled by 2^-p for a nibble read in place
    # at bit p (q 2^p): d 2^-p times it is d q exactly, so fma(d 2^-p, q 2^p, -m) is ggml's (d * q) - m
    # (a high nibble also sits 4 bits up in its byte; from byte 2 on it is read from q >> 16)
    d_lo = (d * _field(sc, 0x3F, e23))[:, :, None] * _in_place_scale(3)
    m_lo = -(dmin * _field(mn, 0x3F, e23))[:, :, None]
    d_hi = (d * (_field(sc, 0x3F00, e23) * 0.00390625))[:, :, None] * (_in_place_scale(2) * 0.0625)
    m_hi = -(dmin * (_field(mn, 0x3F00, e23) * 0.00390625))[:, :, None]
    return d_lo, m_lo, d_hi, m_hi


@triton.jit
def _q4k_weights(loaded, scales, pair, e23):
    """ggml's weights under quant words 2 pair and 2 pair + 1 (bytes i = 8 pair .. 8 pair + 7): their low
    nibbles, then their high nibbles, each [R, L, 4] with byte j of a word in slot j."""
    d_lo, m_lo, d_hi, m_hi = scales
    w0, w1 = loaded[Q4K_QUANTS + 2 * pair], loaded[Q4K_QUANTS + 1 + 2 * pair]
    return (tl.fma(d_lo, _bytes_in_place(w0, e23, 0xF, 3, 0), m_lo),
            tl.fma(d_lo, _bytes_in_place(w1, e23, 0xF, 3, 0), m_lo),
            tl.fma(d_hi, _bytes_in_place(w0, e23, 0xF0, 2, 0), m_hi),
            tl.fma(d_hi, _bytes_in_place(w1, e23, 0xF0, 2, 0), m_hi))


@triton.jit
def _fold(accs, weights, xs, BLOCK_M: tl.constexpr, ROW_GROUPS: tl.constexpr):
    """accs[r * ROW_GROUPS + g] += weights[g][t] * xs[r][t], t = 0 .. 3 in order: one fixed FMA chain for
    each (weight row, lane, slot, x row)."""
    summed = ()
    for r in tl.static_range(BLOCK_M):
        for g in tl.static_range(ROW_GROUPS):
            acc = accs[r * ROW_GROUPS + g]
            for t in tl.static_range(4):
                acc = tl.fma(weights[g][t], xs[r][t], acc)
            summed = summed + (acc,)
    return summed


@triton.jit
def _q4k_step(accs, x_rows, loaded, kb0, nb, e23, BLOCK_M: tl.constexpr, ROW_GROUPS: tl.constexpr,
              LANES: tl.constexpr, TAIL: tl.constexpr):
    """Lane (s, v): quant bytes 16v + i (i < 16) of super-block kb0 + s, i.e. weights 64c + 16h + i (low
    nibbles, sub-block 2c) and 64c + 32 + 16h + i (high nibbles, sub-block 2c + 1), c = v // 2, h = v % 2.
    Word t of the lane's quants holds i = 4t + j; byte j of a word is slot j of the last axis."""
    s, v = _lane(LANES)
    kb = kb0 + s
    c = v // 2
    ok = (kb < nb)[None, :]
    cols = kb * 256 + c * 64 + (v % 2) * 16
    scales = ()
    for g in tl.static_range(ROW_GROUPS):
        scales = scales + (_q4k_scales(loaded[g], c, e23),)
    for pair in tl.static_range(2):  # words t = 2 pair and 2 pair + 1
        xs = _x_rows(x_rows, cols + 8 * pair, 32, ok, BLOCK_M, TAIL)
        weights = ()
        for g in tl.static_range(ROW_GROUPS):
            weights = weights + (_q4k_weights(loaded[g], scales[g], pair, e23),)
        accs = _fold(accs, weights, xs, BLOCK_M, ROW_GROUPS)
    return accs
