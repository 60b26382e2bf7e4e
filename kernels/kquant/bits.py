"""Triton helpers that read ggml's packed k-quant fields as exact fp32 values, cheaply.

Shared by the Q4_K and Q6_K steps of the GEMV (kernels/kquant/q4k.py, kernels/kquant/q6k.py) and its
x loads (kernels/kquant/lanes.py). Every value they produce is exact (no rounding), so the Q4_K weights
built from them are ggml's to the bit; docs/KERNELS.md says where that matters.
"""
from __future__ import annotations

import triton
import triton.language as tl

# 2^23's fp32 bits: a kernel argument, so it sits in a register and `_field`'s mask and OR fuse into
# one LOP3 (a second immediate operand would need its own instruction)
E23 = 0x4B000000


@triton.jit
def _field(word, MASK: tl.constexpr, e23):
    """Exact float of word & MASK read in place, i.e. the field times 2^its bit offset (MASK within bits 0..22).

    OR-ed into the mantissa of 2^23, then 2^23 subtracted: no int-to-float conversion, which issues
    at a quarter of the rate of the integer and float operations around it.
    """
    return _field_less(word, MASK, e23, 8388608.0)


@triton.jit
def _field_less(word, MASK: tl.constexpr, e23, bias):
    """_field less (bias - 2^23), an integer below 2^23, in the same subtraction: a quant's zero point comes
    off for free."""
    return ((word & MASK) | e23).to(tl.float32, bitcast=True) - bias


@triton.jit
def _load(ptr, ok, TAIL: tl.constexpr):
    """tl.load(ptr); in the K walk's TAIL step, only where ok (0 elsewhere). Full steps carry no mask."""
    if TAIL:
        return tl.load(ptr, mask=ok, other=0)
    else:
        return tl.load(ptr)


@triton.jit
def _split4(v):
    """v [A, B, 4] -> its four [A, B] slices (one thread holds all four)."""
    a, b = tl.split(tl.reshape(v, (v.shape[0], v.shape[1], 2, 2)))
    v0, v2 = tl.split(a)
    v1, v3 = tl.split(b)
    return v0, v1, v2, v3


@triton.jit
def _load4(ptr):
    """ptr[..., 0:4] for pointers ptr [A, B] as four [A, B] tensors: one vector load a lane when aligned."""
    return _split4(tl.load(ptr[:, :, None] + tl.arange(0, 4)[None, None, :]))


@triton.jit
def _fp16_low(word):
    """fp32 value of the fp16 in the low 16 bits of word."""
    return word.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _funnel(lo, hi, shift):
    """Bits shift .. shift + 31 of the 64-bit hi:lo, i.e. the word starting shift / 8 bytes into lo (one SHF)."""
    wide = (hi.to(tl.int64) << 32) | (lo.to(tl.int64) & 0xFFFFFFFF)
    return (wide >> shift).to(tl.int32)


@triton.jit
def _words5(ptr):
    """The five aligned words ptr[0..4] for pointers ptr [A, B]: a 16-byte run that starts 0 or 2 bytes into
    ptr[0] (what a 2-byte aligned Q6_K super-block has), for _funnel4."""
    return tl.load(ptr), tl.load(ptr + 1), tl.load(ptr + 2), tl.load(ptr + 3), tl.load(ptr + 4)


@triton.jit
def _funnel4(words, FIRST: tl.constexpr, shift):
    """The run's four words from the five aligned ones at words[FIRST ..], each shift / 8 bytes on."""
    return (_funnel(words[FIRST], words[FIRST + 1], shift), _funnel(words[FIRST + 1], words[FIRST + 2], shift),
            _funnel(words[FIRST + 2], words[FIRST + 3], shift), _funnel(words[FIRST + 3], words[FIRST + 4], shift))


@triton.jit
def _byte_offsets(SPLIT: tl.constexpr):
    """[1, 1, 4]: where _bytes_in_place reads byte j's field: bit 8j of q, or for j >= SPLIT bit 8(j - 2) of
    q >> 16 (a field must end below bit 23, 2^23's exponent)."""
    j = tl.arange(0, 4)[None, None, :]
    return tl.where(j < SPLIT, 8 * j, 8 * j - 16)


@triton.jit
def _pow2(e):
    """2^e as fp32 for small integer tensors e, exactly: e + 127 in the exponent bits."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _in_place_scale(SPLIT: tl.constexpr):
    """[1, 1, 4]: 2^-_byte_offsets(SPLIT), which turns a field read in place back into its value (exactly)."""
    return _pow2(-_byte_offsets(SPLIT))


@triton.jit
def _bytes_in_place(q, e23, MASK: tl.constexpr, SPLIT: tl.constexpr, ZERO: tl.constexpr):
    """The field MASK of each byte j of words q [R, L], less the zero point ZERO (in units of the field), as
    exact floats [R, L, 4] read in place: times 2^_byte_offsets(SPLIT)[j]. The slot masks and biases are
    constants, so on a GPU a slot costs one mask-and-OR and one subtraction."""
    at = _byte_offsets(SPLIT)
    src = tl.where(tl.arange(0, 4)[None, None, :] < SPLIT, q[:, :, None], (q >> 16)[:, :, None])
    bias = 8388608.0 + (ZERO * (MASK & -MASK)) * _pow2(at)
    return _field_less(src, MASK << at, e23, bias)
