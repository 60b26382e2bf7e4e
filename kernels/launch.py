"""Plumbing shared by every kernel wrapper: device checks, block sizes (launches go through replay.launch)."""
from __future__ import annotations

import os
from typing import Any

import torch
import triton

import replay

_TRUE = ("1", "true", "on", "yes")


def interpreter_active() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in _TRUE


def check_device(op: str, *tensors: torch.Tensor | None) -> torch.device:
    """The one device all `tensors` live on; a clear error if a Triton kernel cannot run there."""
    devices = {t.device for t in tensors if t is not None}
    if len(devices) != 1:
        raise ValueError(f"{op}: tensors must share one device, got {sorted(map(str, devices))}")
    device = devices.pop()
    if device.type == "cpu" and not interpreter_active():
        raise RuntimeError(f"{op}: Triton kernels on CPU tensors need TRITON_INTERPRET=1 "
                           "set before triton is first imported")
    if device.type not in ("cpu", "cuda"):
        raise RuntimeError(f"{op}: no Triton backend for device '{device}'")
    return device


def check_last_dim_contiguous(op: str, **tensors: torch.Tensor) -> None:
    for name, t in tensors.items():
        if t.stride(-1) != 1:
            raise ValueError(f"{op}: '{name}' must be contiguous in its last dimension, strides {t.stride()}")


def next_pow2(n: int) -> int:
    return triton.next_power_of_2(max(int(n), 1))


def warps_for(block_elements: int) -> int:
    """Warps for a program owning `block_elements` values: ~8-16 values a thread."""
    return max(1, min(16, block_elements // 512))


def elementwise_rows(op: str, kernel: Any, **inputs: torch.Tensor) -> torch.Tensor:
    """Run a two-input elementwise row kernel over [M, H] tensors; the output takes the first's dtype.

    The kernel's signature is (a, b, out, H, stride_a, stride_b, stride_out, BLOCK); the grid is
    one program per BLOCK-wide slice of a row.
    """
    (name_a, a), (name_b, b) = inputs.items()
    check_device(op, a, b)
    check_last_dim_contiguous(op, **inputs)
    if a.dim() != 2 or a.shape != b.shape:
        raise ValueError(f"{op}: {name_a} and {name_b} must both be [M, H], "
                         f"got {tuple(a.shape)} and {tuple(b.shape)}")
    m, h = a.shape
    out = torch.empty((m, h), dtype=a.dtype, device=a.device)
    block = min(next_pow2(h), 4096)
    replay.launch(kernel, (m, triton.cdiv(h, block)), a, b, out, h, a.stride(0), b.stride(0), out.stride(0),
        BLOCK=block, num_warps=warps_for(block))
    return out
