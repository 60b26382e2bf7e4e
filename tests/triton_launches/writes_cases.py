"""Kernels whose writes tests/launches/test_writes.py reads (a module, so that their source is a file)."""
import triton
import triton.language as tl


@triton.jit
def _store_into(dst, offs, value, mask):
    tl.store(dst + offs, value, mask=mask)


@triton.jit
def _read_from(src, offs, mask):
    return tl.load(src + offs, mask=mask, other=0.0)


@triton.jit
def plain(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)


@triton.jit
def through_helpers(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    _store_into(out_ptr, offs, _read_from(x_ptr, offs, mask), mask)


@triton.jit
def advanced_pointer(x_ptr, acc_ptr, lock_ptr, stride, n, BLOCK: tl.constexpr):
    p = acc_ptr + tl.program_id(0) * stride
    q = x_ptr.to(tl.pointer_type(tl.float32))
    for i in range(0, n, BLOCK):
        p += BLOCK
        value = tl.load(q + i + tl.arange(0, BLOCK))
        tl.store(p + tl.arange(0, BLOCK), value)
    tl.atomic_add(lock_ptr, 1)


@triton.jit
def block_pointer(x_ptr, out_ptr, M, N, BLOCK: tl.constexpr):
    src = tl.make_block_ptr(x_ptr, (M, N), (N, 1), (0, 0), (BLOCK, BLOCK), (1, 0))
    dst = tl.make_block_ptr(base=out_ptr, shape=(M, N), strides=(N, 1), offsets=(0, 0), block_shape=(BLOCK, BLOCK),
                            order=(1, 0))
    tl.store(dst, tl.load(src))


def opaque(pointer):  # not a Triton function: what it does cannot be read
    return pointer


@triton.jit
def hands_to_unknown(x_ptr, out_ptr):
    opaque(x_ptr)
    tl.store(out_ptr, 1.0)


@triton.jit
def indirect(src_ptr, cache_ptr, position_buf, D: tl.constexpr):
    pos = tl.load(position_buf + tl.program_id(0))  # a position read: the cache is written, not the buffer
    d = tl.arange(0, D)
    old = tl.atomic_add(cache_ptr + pos * D + d, tl.load(src_ptr + d))
    tl.store(src_ptr + old.to(tl.int32), 0.0)  # an address from what an atomic returned
