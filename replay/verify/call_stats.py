"""The statistics the outlier gate reads, computed on the tensors' device for a batch of calls at
once: one kernel launch for the batch, none for a call.

A batch lists its tensors in a table of (address, element count, element type) rows; one kernel
reads every listed tensor and writes, per tensor, PROGRAMS partial sums of |x| and x^2 and
partial maxima of |x| ([rows, 3, PROGRAMS]: the host reduces along its last, contiguous axis). On a GPU both the table and the partials live in pinned host memory,
which the device reads and writes directly (unified addressing): a batch costs the launch and an
event, no copy. The gate's thread finishes the reduction once the event has passed
(replay/verify/gate.py). On the host (no GPU, or tensors in host memory) numpy computes the same
partials (one "program" a tensor), for the whole batch in a few array operations.

Launching: after the first launch, which compiles the kernel, the compiled kernel's launcher is
called directly (replay/direct_launch.py). Its arguments never change kind (two pinned buffers),
so one compiled kernel serves every batch.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import triton
import triton.language as tl

from replay.direct_launch import DirectLauncher

MAX_TENSORS = 4  # the first floating-point tensors of a call that the gate reads
STAT_ELEMENTS = 1 << 20  # larger ones (weights) are described by their size only: reading them costs too much
PROGRAMS = 32  # partial results a tensor: programs reading it side by side
BLOCK = 4096  # elements a program reads a step
TYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2, torch.float64: 3}


@triton.jit
def _partials(x_ptr, n, out_ptr, PROGRAMS: tl.constexpr, BLOCK: tl.constexpr):
    """This program's share of x: sum |x|, sum x^2, max |x| (NaN carried by the sums), PROGRAMS
    apart."""
    offsets = tl.arange(0, BLOCK)
    absolute = tl.zeros([BLOCK], tl.float32)
    squares = tl.zeros([BLOCK], tl.float32)
    top = tl.zeros([BLOCK], tl.float32)
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        at = start + offsets
        value = tl.load(x_ptr + at, mask=at < n, other=0.0).to(tl.float32)
        magnitude = tl.abs(value)
        absolute += magnitude
        squares += value * value
        top = tl.maximum(top, magnitude)
    tl.store(out_ptr, tl.sum(absolute, 0))
    tl.store(out_ptr + PROGRAMS, tl.sum(squares, 0))
    tl.store(out_ptr + 2 * PROGRAMS, tl.max(top, 0))


@triton.jit
def _batch_stats_kernel(table_ptr, out_ptr, PROGRAMS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(1)
    address = tl.load(table_ptr + row * 3)
    n = tl.load(table_ptr + row * 3 + 1)
    code = tl.load(table_ptr + row * 3 + 2)
    out = out_ptr + row * 3 * PROGRAMS + tl.program_id(0)
    # one branch an element type (TYPE_CODES)
    if code == 0:
        _partials(address.to(tl.pointer_type(tl.float32)), n, out, PROGRAMS, BLOCK)
    elif code == 1:
        _partials(address.to(tl.pointer_type(tl.bfloat16)), n, out, PROGRAMS, BLOCK)
    elif code == 2:
        _partials(address.to(tl.pointer_type(tl.float16)), n, out, PROGRAMS, BLOCK)
    else:
        _partials(address.to(tl.pointer_type(tl.float64)), n, out, PROGRAMS, BLOCK)


def buffers(batches: int, rows: int, cuda: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The tables ([batches, rows, 3] int64) and partials ([batches, rows, 3, PROGRAMS] float32) of
    `batches` batches in flight; pinned (and so reachable from the device) for a GPU."""
    table = torch.zeros(batches, rows, 3, dtype=torch.int64, pin_memory=cuda)
    partials = torch.zeros(batches, rows, 3, PROGRAMS, dtype=torch.float32, pin_memory=cuda)
    return table, partials


def on_host(tensors: list[torch.Tensor], partials: torch.Tensor) -> None:
    """The partials of host tensors (contiguous, none empty), computed now in numpy, every tensor
    of the batch in one pass (program 0 of each row; the rest zero): a few array operations a
    batch rather than a few torch operators a tensor."""
    partials[:len(tensors)].zero_()
    if not tensors:
        return
    values = np.concatenate([_host_values(tensor) for tensor in tensors]).astype(np.float64)
    starts = np.cumsum([0] + [tensor.numel() for tensor in tensors[:-1]])
    magnitude = np.abs(values)
    rows = partials.numpy()[:len(tensors), :, 0]
    rows[:, 0] = np.add.reduceat(magnitude, starts)
    rows[:, 1] = np.add.reduceat(values * values, starts)
    rows[:, 2] = np.maximum.reduceat(magnitude, starts)  # NaN carried, as by the kernel's sums


def _host_values(tensor: torch.Tensor) -> np.ndarray:
    flat = tensor.detach().reshape(-1)
    return (flat.float() if flat.dtype == torch.bfloat16 else flat).numpy()  # numpy has no bfloat16


def launch(table: torch.Tensor, partials: torch.Tensor, rows: int) -> None:
    """Queue the kernel for the first `rows` rows of `table` (pinned, filled) on the current CUDA
    stream; the partials are in place once the stream has passed it."""
    _LAUNCHER.launch(torch.device("cuda"), (PROGRAMS, rows, 1), table, partials)


def launch_in_triton(table: torch.Tensor, partials: torch.Tensor, rows: int) -> Any:
    """Triton's own launch of the kernel (the interpreter included); returns the compiled kernel
    where Triton gives one."""
    return _LAUNCHER.in_triton((PROGRAMS, rows), table, partials)


_LAUNCHER = DirectLauncher(_batch_stats_kernel, {"PROGRAMS": PROGRAMS, "BLOCK": BLOCK}, num_warps=4)
