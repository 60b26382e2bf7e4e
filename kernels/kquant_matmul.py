"""x [M, K] @ W^T for W [N, K] stored in ggml Q4_K or Q6_K super-blocks; shared by both GEMV ops.

One kernel serves the single-vector GEMV (BLOCK_M = 1) and the small-M batched GEMM (BLOCK_M up
to 4). A program owns BLOCK_N weight rows, held in ROW_GROUPS tensors (on a GPU one row each, see
GemvTile), and walks K with LANES lanes, eight to a super-block, so a step covers LANES / 8
super-blocks. Lane v of a super-block owns the 32 weights under its 16-byte share of the quant
bytes (Q4_K: qs[16v ..], low and high nibbles; Q6_K: ql[16v ..] with the matching qh bits): the
eight lanes read a block's quants side by side, and a warp's weight loads are whole cache lines.

A lane reads its quants as exact floats in place (kernels/kquant_bits.py: no int-to-float
conversion). Q4_K turns them into ggml's fp32 weights, bit for bit (exact products), and folds
each into fp32 running sums with x. Q6_K takes its zero point 32 off in the same subtraction and
multiplies the quants into per-step partial sums with x, one per (weight row, x row, sub-block,
byte slot); only then does the sub-block's scale come in, once a partial sum: a weight costs a
mask-and-OR, a subtraction and one fused multiply-add per x row, not two. (Q4_K's mins would need
sum x too, which costs what it saves: docs/PERFORMANCE.md.) The running sums, one per (weight
row, lane, byte slot, x row), are a fixed chain over K. Nothing crosses lanes until one reduction
over slots and lanes at the end. A step's weight words are loaded while the step before computes.

Row invariance by construction: an x row's sums are the same chain of operations on the same
weights whatever BLOCK_M and BLOCK_N are and whichever rows ride along, and the K walk (LANES and
warps, hence the lane layout, the tail step and the final reduction) comes from (device, N, K)
alone (`tile_config`). Rows past M or N re-read the last row and are computed but never stored.
So batched row r == single(row r) to the bit, on CPU (interpreter) and GPU.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from kernels import launch
from kernels.ggml_quant import DEQUANTIZERS, QK_K, Q4_K, QuantFormat, columns_of
from kernels.kquant_bits import (E23, _bytes_in_place, _field, _fp16_low, _funnel4, _in_place_scale, _load,
                                 _load4, _words5)

# x rows a batched program takes at most: each weight read serves them all, but the K loop is
# unrolled over them (8 rows spill registers on sm_90; 4 rows fit: docs/PERFORMANCE.md)
BATCHED_BLOCK_M = 4


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


@triton.jit
def _lane(LANES: tl.constexpr):
    """Lane u's super-block (of the step's LANES / 8) and its place v (0..7) in it."""
    u = tl.arange(0, LANES)
    return u // 8, u % 8


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
    d_dmin, s0, s1, s2 = loaded[0], loaded[1], loaded[2], loaded[3]
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
    w0, w1 = loaded[4 + 2 * pair], loaded[5 + 2 * pair]
    return (tl.fma(d_lo, _bytes_in_place(w0, e23, 0xF, 3, 0), m_lo),
            tl.fma(d_lo, _bytes_in_place(w1, e23, 0xF, 3, 0), m_lo),
            tl.fma(d_hi, _bytes_in_place(w0, e23, 0xF0, 2, 0), m_hi),
            tl.fma(d_hi, _bytes_in_place(w1, e23, 0xF0, 2, 0), m_hi))


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


@triton.jit
def _q6k_load(w_ptr, row_byte, kb0, nb, LANES: tl.constexpr, WRONG_SCALE: tl.constexpr):
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
    sc_hi = sc + 4
    if WRONG_SCALE:  # planted bug "q6k_scale_index": sub-block 15 (lane 7's high nibbles) takes scale 14
        sc_hi -= (v == 7)[None, :].to(tl.int64)
    d = (w_ptr + start + 208).to(tl.pointer_type(tl.float16))
    shift = ((start & 2) * 8).to(tl.int32)
    return (_words5(blk + (v * 4)[None, :]) + _words5(blk + (32 + n * 8 + h * 4)[None, :])
            + (tl.load(sc), tl.load(sc_hi), tl.load(d), shift))


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
        shift = loaded[g][13]
        runs = runs + ((_funnel4(loaded[g], 0, shift), _funnel4(loaded[g], 5, shift)),)
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
        d = loaded[g][12].to(tl.float32)
        scales = scales + (((d * loaded[g][10].to(tl.float32))[:, :, None] * _in_place_scale(3),
                            (d * loaded[g][11].to(tl.float32))[:, :, None] * _in_place_scale(3)),)
    scaled = ()
    for r in tl.static_range(BLOCK_M):
        for g in tl.static_range(ROW_GROUPS):
            s_lo, s_hi = scales[g]
            lo, hi = sums[r][g]
            scaled = scaled + (tl.fma(s_hi, hi, tl.fma(s_lo, lo, accs[r * ROW_GROUPS + g])),)
    return scaled


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
def _row_offsets(N, row_bytes, BLOCK_N: tl.constexpr, ROW_GROUPS: tl.constexpr):
    """The byte offsets of this program's weight rows, one [BLOCK_N / ROW_GROUPS, 1] tensor a row group; rows
    past N re-read the last row."""
    GROUP: tl.constexpr = BLOCK_N // ROW_GROUPS
    offsets = ()
    for g in tl.static_range(ROW_GROUPS):
        rows = tl.program_id(0) * BLOCK_N + g * GROUP + tl.arange(0, GROUP)
        offsets = offsets + ((tl.minimum(rows, N - 1).to(tl.int64) * row_bytes)[:, None],)
    return offsets


@triton.jit
def _load_step(w_ptr, row_byte, kb0, nb, Q4K: tl.constexpr, LANES: tl.constexpr, ROW_GROUPS: tl.constexpr,
               WRONG_SCALE: tl.constexpr):
    """Every row group's words for the step at super-block kb0."""
    loaded = ()
    for g in tl.static_range(ROW_GROUPS):
        if Q4K:
            loaded = loaded + (_q4k_load(w_ptr.to(tl.pointer_type(tl.int32)) + row_byte[g] // 4, kb0, nb, LANES),)
        else:
            loaded = loaded + (_q6k_load(w_ptr, row_byte[g], kb0, nb, LANES, WRONG_SCALE),)
    return loaded


@triton.jit
def _step(accs, x_rows, loaded, kb0, nb, e23, Q4K: tl.constexpr, BLOCK_M: tl.constexpr, ROW_GROUPS: tl.constexpr,
          LANES: tl.constexpr, TAIL: tl.constexpr):
    """One step of the K walk over the super-blocks from kb0, in the weight's format."""
    if Q4K:
        return _q4k_step(accs, x_rows, loaded, kb0, nb, e23, BLOCK_M, ROW_GROUPS, LANES, TAIL)
    else:
        return _q6k_step(accs, x_rows, loaded, kb0, nb, e23, BLOCK_M, ROW_GROUPS, LANES, TAIL)


@triton.jit
def _kquant_matmul_kernel(x_ptr, w_ptr, out_ptr, M, N, nb, stride_xm, stride_om, row_bytes, e23,
                          Q4K: tl.constexpr, LANES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          ROW_GROUPS: tl.constexpr, WRONG_SCALE: tl.constexpr):
    GROUP: tl.constexpr = BLOCK_N // ROW_GROUPS  # weight rows a tensor holds
    first_m = tl.program_id(1) * BLOCK_M
    row_byte = _row_offsets(N, row_bytes, BLOCK_N, ROW_GROUPS)
    x_rows = ()
    accs = ()
    for r in tl.static_range(BLOCK_M):
        x_rows = x_rows + (x_ptr + tl.minimum(first_m + r, M - 1).to(tl.int64) * stride_xm,)
        for g in tl.static_range(ROW_GROUPS):
            accs = accs + (tl.zeros([GROUP, LANES, 4], dtype=tl.float32),)
    KB: tl.constexpr = LANES // 8  # super-blocks a step
    full = nb - nb % KB
    # each step's weight words are loaded one step ahead, so they arrive while the step before computes;
    # loads past K re-read the last super-block, and a last, partial step masks x there (adding exact zeros)
    loaded = _load_step(w_ptr, row_byte, 0, nb, Q4K, LANES, ROW_GROUPS, WRONG_SCALE)
    for kb0 in tl.range(0, full, KB):
        ahead = _load_step(w_ptr, row_byte, kb0 + KB, nb, Q4K, LANES, ROW_GROUPS, WRONG_SCALE)
        # a fence for the scheduler: without it the compiler sinks these loads below the step's math (to
        # shorten their lives), and they no longer overlap it (a no-op in the interpreter)
        tl.debug_barrier()
        accs = _step(accs, x_rows, loaded, kb0, nb, e23, Q4K, BLOCK_M, ROW_GROUPS, LANES, False)
        loaded = ahead
    if full < nb:
        accs = _step(accs, x_rows, loaded, full, nb, e23, Q4K, BLOCK_M, ROW_GROUPS, LANES, True)
    for r in tl.static_range(BLOCK_M):
        m = first_m + r
        if m < M:
            for g in tl.static_range(ROW_GROUPS):
                rows = tl.program_id(0) * BLOCK_N + g * GROUP + tl.arange(0, GROUP)
                tl.store(out_ptr + m.to(tl.int64) * stride_om + rows,
                         tl.sum(tl.sum(accs[r * ROW_GROUPS + g], axis=2), axis=1).to(out_ptr.dtype.element_ty),
                         mask=rows < N)


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


def _aligned(t: torch.Tensor, row_multiple: int) -> torch.Tensor:
    """t, copied if the kernel's aligned word loads cannot reach it as it lies: its first byte must sit on a
    4-byte boundary, and its rows row_multiple elements apart."""
    if t.data_ptr() % 4 or t.stride(0) % row_multiple:
        return t.clone(memory_format=torch.contiguous_format)
    return t


def kquant_matmul(x: torch.Tensor, weight: torch.Tensor, fmt: QuantFormat, *, block_m: int,
                  wrong_scale: bool = False, config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
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
    launch.run(_kquant_matmul_kernel, (triton.cdiv(n, tile.block_n), triton.cdiv(m, block_m)),
               x, weight, out, m, n, nb, x.stride(0), out.stride(0), weight.stride(0), E23,
               Q4K=fmt == Q4_K, LANES=tile.lanes, BLOCK_M=block_m, BLOCK_N=tile.block_n, ROW_GROUPS=tile.row_groups,
               WRONG_SCALE=wrong_scale, num_warps=tile.warps)
    return out


def dequant_matmul_reference(x: torch.Tensor, weight: torch.Tensor, fmt: QuantFormat) -> torch.Tensor:
    """ggml's dequantisation, then an fp32 matmul, rounded once to x's dtype."""
    w = DEQUANTIZERS[fmt.name](weight)
    return (x.float() @ w.T).to(x.dtype)
