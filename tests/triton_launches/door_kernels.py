"""Kernels and an op that tests/triton_launches/test_door.py records (modules of their own, so that
`replay run --provider door_kernels --provider writes_cases` finds them again)."""
import torch
import triton
import triton.language as tl

import replay
from writes_cases import plain as double_kernel  # out = 2 * x


@triton.jit
def cast_kernel(x_ptr, out_ptr, n, OUT_DTYPE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask).to(OUT_DTYPE), mask=mask)


benchmarked: list[int] = []  # one entry a config the autotuner timed


def count_and_run(kernel_call, quantiles=None):
    """A benchmarker that runs on any device: one launch a config, the same time for each."""
    benchmarked.append(1)
    kernel_call()
    return [1.0, 1.0, 1.0] if quantiles else 1.0


@triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"],
                 do_bench=count_and_run)
@triton.jit
def tuned_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def double(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    double_kernel[(triton.cdiv(x.numel(), 16),)](x, out, x.numel(), BLOCK=16)
    return out


doubled = replay.op("door_kernels.doubled")


@doubled.reference
def doubled_reference(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@doubled.batched
def doubled_by_triton(x: torch.Tensor) -> torch.Tensor:
    return double(x)  # its kernel's launch belongs to this call


@replay.reference_for("door_kernels.cast_kernel")
def cast_reference(x_ptr, out_ptr, n, OUT_DTYPE, BLOCK):
    out_ptr[:n].copy_(x_ptr[:n])


def launch_double_first(args, **_):
    """A pre-hook that launches another kernel, as a hook that zeroes a buffer with Triton may."""
    double(args["x_ptr"])


@triton.autotune(configs=[triton.Config({"BLOCK": 32}, pre_hook=launch_double_first)], key=["n"])
@triton.jit
def hooked_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


@triton.autotune(configs=[triton.Config({"BLOCK": 32})], key=["n"])
@triton.heuristics({"EVEN": lambda args: args["n"] % args["BLOCK"] == 0})
@triton.jit
def tuned_heuristic_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) - 1, mask=mask)


@triton.jit
def odd_names_kernel(x_ptr, out_ptr, scale, kernel: tl.constexpr, binds: tl.constexpr, block: tl.constexpr):
    """Constexprs named like a launch record's own keys, lower-case; `scale` may be None."""
    offs = tl.arange(0, block)
    y = tl.load(x_ptr + offs) * kernel + binds
    if scale is not None:
        y = y * scale
    tl.store(out_ptr + offs, y)


class Kernels:
    """A kernel kept on a class: its qualified name has a dot."""

    @staticmethod
    @triton.jit
    def nested(x_ptr, out_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs) - 1)


def made_in_a_function():
    """A kernel made each time this runs: no import finds it by its qualified name."""
    @triton.jit
    def local_kernel(x_ptr, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(x_ptr + offs, tl.load(x_ptr + offs) * 3)
    return local_kernel


@triton.jit
def scaled_rows_kernel(x_ptr, w_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    """Each row of x times w (one program a row)."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask)
    tl.store(out_ptr + row * n_cols + cols, x * tl.load(w_ptr + cols, mask=mask), mask=mask)


@triton.jit
def strided_copy_kernel(x_ptr, out_ptr, stride, n, BLOCK: tl.constexpr):
    """Vectorised loads only where Triton's launch knew `stride` was 1 and the pointers aligned."""
    i = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i * stride, mask=i < n), mask=i < n)


@triton.jit(do_not_specialize=["stride"])
def unspecialised_copy_kernel(x_ptr, out_ptr, stride, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i * stride, mask=i < n), mask=i < n)


@triton.jit
def annotated_copy_kernel(x_ptr, out_ptr, stride: tl.int32, n, BLOCK: tl.constexpr):
    """A parameter annotated with its type is launched as that type, never as the constant 1."""
    i = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.load(x_ptr + i * stride, mask=i < n), mask=i < n)
