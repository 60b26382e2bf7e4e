"""The k-quant GEMV's Triton kernel: a program's walk over K for its weight rows and x rows, one step of
super-blocks at a time in the weight's format (kernels/kquant/q4k.py, kernels/kquant/q6k.py), each step's
words loaded one step ahead, and one reduction at the end.

Why each output's sum is the same chain of operations whatever rows ride along: docs/KERNELS.md
("Determinism and row invariance").
"""
from __future__ import annotations

import triton
import triton.language as tl

from replay_kernels.kquant.q4k import _q4k_load, _q4k_step
from replay_kernels.kquant.q6k import _q6k_load, _q6k_step


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
def _load_step(w_ptr, row_byte, kb0, nb, Q4K: tl.constexpr, LANES: tl.constexpr, ROW_GROUPS: tl.constexpr):
    """Every row group's words for the step at super-block kb0."""
    loaded = ()
    for g in tl.static_range(ROW_GROUPS):
        if Q4K:
            loaded = loaded + (_q4k_load(w_ptr.to(tl.pointer_type(tl.int32)) + row_byte[g] // 4, kb0, nb, LANES),)
        else:
            loaded = loaded + (_q6k_load(w_ptr, row_byte[g], kb0, nb, LANES),)
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
                          ROW_GROUPS: tl.constexpr):
    """out[m, n] = x[m] . dequant(W[n]) for this program's BLOCK_N weight rows (program_id 0) and BLOCK_M x
    rows (program_id 1). W's rows are row_bytes apart, nb super-blocks each; e23 is bits.E23."""
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
    loaded = _load_step(w_ptr, row_byte, 0, nb, Q4K, LANES, ROW_GROUPS)
    for kb0 in tl.range(0, full, KB):
        ahead = _load_step(w_ptr, row_byte, kb0 + KB, nb, Q4K, LANES, ROW_GROUPS)
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
