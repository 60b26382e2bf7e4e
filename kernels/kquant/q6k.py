"""One step of the GEMV's K walk over a Q6_K weight: load a lane's words, multiply its quants (less the zero
point) into partial sums with x, and only then scale each partial sum by its sub-block's d * sc.

Why that order for Q6_K, and the lane layout: docs/KERNELS.md ("Determinism and row invariance").
"""
from __future__ import annotations

import triton
import triton.language as tl

from replay_kernels.kquant.bits import _bytes_in_place, _funnel4, _in_place_scale, _words5
from replay_kernels.kquant.lanes import _lane, _x_rows

# slots of a row group's tuple from _q6k_load: the five aligned words under the lane's ql run, the five under
# its qh run, the int8 scales of its low and high nibbles' sub-blocks, d, and the bit shift (0 or 16) at which
# both runs start in their first words
Q6K_QL = tl.constexpr(0)  # words 0 .. 4
Q6K_QH = tl.constexpr(5)  # words 5 .. 9
Q6K_SCALE_LO = tl.constexpr(10)
Q6K_SCALE_HI = tl.constexpr(11)
Q6K_D = tl.constexpr(12)
Q6K_SHIFT = tl.constexpr(13)


@triton.jit
def _q6k_load(w_ptr, row_byte, kb0, nb, LANES: tl.constexpr):
    """What lane (s, v) needs of super-block kb0 + s (clamped to the last one; the step masks x there): the
    aligned words under ql[16v ..], then under qh[32n + 16h ..] (n = v // 4, h = v % 2), each a 16-byte run
    that the block's 2-byte alignment spreads over five words; its two int8 scales; d; and the bit shift
    (0 or 16) at which the block starts in its first word."""
    s, v = _lane(LANES)
    kb = tl.minimum(kb0 + s, nb - 1)
    n = v // 4
    h = v % 2
    start = row_byte + (kb * 210)[None, :]
    blk = w_ptr.to(tl.pointer_type(tl.int32)) + (start >> 2)  # the aligned word the block starts in
    sc = w_ptr.to(tl.pointer_type(tl.int8)) + start + (192 + n * 8 + ((v // 2) % 2) * 2 + h)[None, :]
    sc_hi = sc + 4  # the high nibbles' sub-block, two quarters on
    d = (w_ptr + start + 208).to(tl.pointer_type(tl.float16))
    shift = ((start & 2) * 8).to(tl.int32)
    return (_words5(blk + (v * 4)[None, :]) + _words5(blk + (32 + n * 8 + h * 4)[None, :])
            + (tl.load(sc), tl.load(sc_hi), tl.load(d), shift))


@triton.jit
def _q6k_quants(ql, top, e23):
    """(low quarter, high quarter) of a word's four positions: 4 bits from ql, 2 from top (qh shifted so the
    low quarter's sit at bits 0-1 of each byte), less the zero point 32, as exact floats read in place."""
    q_lo = (ql & 0x0F0F0F0F) | ((top << 4) & 0x30303030)
    q_hi = ((ql >> 4) & 0x0F0F0F0F) | (top & 0x30303030)
    return _bytes_in_place(q_lo, e23, 0x3F, 3, 32), _bytes_in_place(q_hi, e23, 0x3F, 3, 32)


@triton.jit
def _dot_pairs(sums, quants, xs, FIRST: tl.constexpr, BLOCK_M: tl.constexpr, ROW_GROUPS: tl.constexpr):
    """sums[r][g] = (low, high) += a pair of words' quants (row group g) times x row r's columns under them,
    word 0 then word 1: one fixed chain (a product, then fused multiply-adds) a (weight row, lane, slot, x
    row), which the FIRST pair starts. quants[g] = (low 0, high 0, low 1, high 1); xs[r] = (low 0, low 1,
    high 0, high 1)."""
    out = ()
    for r in tl.static_range(BLOCK_M):
        row = ()
        for g in tl.static_range(ROW_GROUPS):
            q = quants[g]
            if FIRST:
                lo = q[0] * xs[r][0]
                hi = q[1] * xs[r][2]
            else:
                lo = tl.fma(q[0], xs[r][0], sums[r][g][0])
                hi = tl.fma(q[1], xs[r][2], sums[r][g][1])
            row = row + ((tl.fma(q[2], xs[r][1], lo), tl.fma(q[3], xs[r][3], hi)),)
        out = out + (row,)
    return out


@triton.jit
def _q6k_step(accs, x_rows, loaded, kb0, nb, e23, BLOCK_M: tl.constexpr, ROW_GROUPS: tl.constexpr,
              LANES: tl.constexpr, TAIL: tl.constexpr):
    """Lane (s, v) takes ql[16v + i] (i < 16) of super-block kb0 + s: with v = 4n + 2q + h, the low 4 bits of
    positions l = 16h + i of quarter g = q (low nibbles) and g = q + 2 (high nibbles) of half n, weights
    128n + 32g + l. Their top 2 bits are in qh[32n + l] at bit 2g, their scales sc[8n + 2g + h]: one a
    quarter, so a step's partial sums are scaled once. Word t of a run holds i = 4t + j, byte j in slot j."""
    s, v = _lane(LANES)
    kb = kb0 + s
    n = v // 4
    quarter = (v // 2) % 2  # q: the low nibbles' quarter; the high ones' is q + 2
    ok = (kb < nb)[None, :]
    # quarter g's top bits sit at bit 2g of qh: shifted to bits 0-1 (g = q) or 4-5 (g = q + 2)
    hs = 2 * quarter[None, :]
    cols = kb * 256 + n * 128 + quarter * 32 + (v % 2) * 16
    runs = ()
    for g in tl.static_range(ROW_GROUPS):
        shift = loaded[g][Q6K_SHIFT]
        runs = runs + ((_funnel4(loaded[g], Q6K_QL, shift), _funnel4(loaded[g], Q6K_QH, shift)),)
    sums = ()
    for pair in tl.static_range(2):  # words t = 2 pair and 2 pair + 1
        xs = _x_rows(x_rows, cols + 8 * pair, 64, ok, BLOCK_M, TAIL)
        quants = ()
        for g in tl.static_range(ROW_GROUPS):
            ql, qh = runs[g]
            quants = quants + (_q6k_quants(ql[2 * pair], qh[2 * pair] >> hs, e23)
                               + _q6k_quants(ql[2 * pair + 1], qh[2 * pair + 1] >> hs, e23),)
        sums = _dot_pairs(sums, quants, xs, pair == 0, BLOCK_M, ROW_GROUPS)
    scales = ()
    for g in tl.static_range(ROW_GROUPS):  # ggml's d * sc (exact), with each slot's in-place 2^-p
        d = loaded[g][Q6K_D].to(tl.float32)
        scales = scales + (((d * loaded[g][Q6K_SCALE_LO].to(tl.float32))[:, :, None] * _in_place_scale(3),
                            (d * loaded[g][Q6K_SCALE_HI].to(tl.float32))[:, :, None] * _in_place_scale(3)),)
    scaled = ()
    for r in tl.static_range(BLOCK_M):
        for g in tl.static_range(ROW_GROUPS):
            s_lo, s_hi = scales[g]
            lo, hi = sums[r][g]
            scaled = scaled + (tl.fma(s_hi, hi, tl.fma(s_lo, lo, accs[r * ROW_GROUPS + g])),)
    return scaled
