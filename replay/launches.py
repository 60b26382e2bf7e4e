"""Launching a Triton kernel with its launch recorded: `replay.launch(kernel, grid, *args, **meta)`.

Inside a call being recorded or replayed, the launch goes into the call's launch records with
what compiling the kernel again takes (its module, Triton's own signature for the arguments
given, the constexprs), its grid, block sizes, warps and the code path taken, and which of the
call's arguments each pointer parameter points into. `replay ptx --snapshot` and `replay trace
--resources` compile recorded launches again from exactly this.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from replay.context import launches_wanted, record_launch


def launch(kernel: Any, grid: Sequence[int], *args: Any, path: str | None = None, **meta: Any) -> Any:
    """Launch Triton `kernel` on `grid` with `args` and the keyword constexprs and options `meta`;
    inside a recorded or replayed call, record the launch.

    Args:
        kernel: a `@triton.jit` function.
        grid: the launch grid (a sequence of ints).
        path: which of the op's code paths this launch is ("direct", "indirect"), kept with it.

    Returns:
        What the launch returns (on a GPU, the compiled kernel).

    Example:
        replay.launch(_rmsnorm_kernel, (rows,), x, weight, out, hidden, BLOCK=block, num_warps=4)
    """
    grid = tuple(int(g) for g in grid)
    compiled = kernel[grid](*args, **meta)
    if not launches_wanted():
        return compiled
    info = {k: v for k, v in meta.items() if isinstance(v, (bool, int, str))}
    if path is not None:
        info["path"] = path
    pointers = {name: getattr(value, "base", value) for name, value in zip(kernel.arg_names, args)
                if isinstance(getattr(value, "base", value), torch.Tensor)}  # a tensor descriptor: its base
    specialisations = {name: key for name, value in zip(kernel.arg_names, args)
                       if (key := specialisation(value, value.data_ptr() if isinstance(value, torch.Tensor) else None))}
    record_launch(kernel.fn.__name__, grid, compiled=compiled, pointers=pointers, module=kernel.fn.__module__,
                  signature=signature(kernel, args, meta), specialisations=specialisations, **info)
    return compiled


def specialisation(value: Any, address: int | None = None) -> str | None:
    """What Triton's launch specialises an argument on beyond its type (replay/ptx/compile.py):
    "1" for an int equal to 1, "D" for an int divisible by 16 or a tensor at an `address` aligned
    to 16 bytes; None for anything else."""
    if type(value) is int:
        return "1" if value == 1 else "D" if value % 16 == 0 else None
    return "D" if address is not None and address % 16 == 0 else None


def signature(kernel: Any, args: Sequence[Any], meta: dict[str, Any]) -> dict[str, str]:
    """Triton's signature of a launch, in Triton's own terms ("*fp32" for a pointer, "i32",
    "tensordesc<bf16[64, 32]>"), "constexpr" for the arguments given by keyword: what
    triton.compile(ASTSource(...)) takes to compile the same kernel again."""
    from triton.runtime.jit import mangle_type

    types = {name: mangle_type(value) for name, value in zip(kernel.arg_names, args)}
    return {**types, **{name: "constexpr" for name in kernel.arg_names if name in meta}}
