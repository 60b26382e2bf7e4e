"""swiglu(gate [M, F], up [M, F]) -> silu(gate) * up, computed in fp32, stored in gate's dtype.

Elementwise, like residual_add: single and batched share one kernel, a BLOCK-wide slice of
one row per program.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import replay
from replay_kernels import launch
from replay.tolerance import ELEMENTWISE

swiglu = replay.op(
    "swiglu",
    batch_axes={"gate": 0, "up": 0, "out": 0},
    tolerance=ELEMENTWISE,
    doc="out = gate * sigmoid(gate) * up, computed in fp32.",
    kernel_rules=replay.KernelRules(row_axis="x"),
)


@triton.jit
def _swiglu_kernel(gate_ptr, up_ptr, out_ptr, F, stride_gate, stride_up, stride_out,
                   BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < F
    g = tl.load(gate_ptr + row * stride_gate + cols, mask=mask).to(tl.float32)
    u = tl.load(up_ptr + row * stride_up + cols, mask=mask).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


@swiglu.reference
def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g = gate.double()
    return (g * torch.sigmoid(g) * up.double()).to(gate.dtype)


@swiglu.single_and_batched
def swiglu_rows(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for [M, F] rows (the single variant is M = 1)."""
    return launch.elementwise_rows("swiglu", _swiglu_kernel, gate=gate, up=up)
