"""rope(x [T, H, D], positions [T], cos [P, D/2], sin [P, D/2], layout) -> x rotated at its positions.

Rotary position embedding. Each pair (x1, x2) of a head is rotated by the angle of its row's
position: (x1 cos - x2 sin, x2 cos + x1 sin). The pairs are
- layout "neox":        (d, d + D/2) for d < D/2 (GPT-NeoX, Llama in HF format);
- layout "interleaved": (2d, 2d + 1)           (GPT-J, Llama in Meta/ggml format).
cos/sin are fp32 tables made by `rope_tables` (angles computed in fp64, rounded once), indexed
by position, so the kernel never rounds an angle. One program rotates all heads of one row;
single and batched share the kernel.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

import replay
from replay_kernels import launch
from replay.tolerance import ELEMENTWISE

LAYOUTS = ("neox", "interleaved")

rope = replay.op(
    "rope",
    batch_axes={"x": 0, "positions": 0, "out": 0},
    tolerance=ELEMENTWISE,
    doc="Rotary embedding of x [T, H, D] at positions [T] using cos/sin tables [P, D/2]; "
        "layout 'neox' or 'interleaved'.",
    kernel_rules=replay.KernelRules(row_axis="x"),
)


def rope_tables(max_positions: int, head_dim: int, theta: float = 10000.0,
                device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 cos and sin [max_positions, head_dim / 2] of angle p * theta^(-2i / head_dim)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return angles.cos().float().to(device), angles.sin().float().to(device)


@triton.jit
def _rope_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, out_ptr, H, stride_xt, stride_xh,
                 stride_ot, stride_oh, stride_table,
                 HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
                 INTERLEAVED: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_HALF)[None, :]
    c = tl.load(cos_ptr + pos * stride_table + i, mask=i < HALF)
    s = tl.load(sin_ptr + pos * stride_table + i, mask=i < HALF)
    x_row = x_ptr + t * stride_xt + heads * stride_xh
    out_row = out_ptr + t * stride_ot + heads * stride_oh
    if INTERLEAVED:  # whole contiguous rows, pairs split apart in registers
        d = tl.arange(0, 2 * BLOCK_HALF)[None, :]
        mask = (heads < H) & (d < 2 * HALF)
        x1, x2 = tl.split(tl.reshape(tl.load(x_row + d, mask=mask).to(tl.float32), [BLOCK_H, BLOCK_HALF, 2]))
        out = tl.join(x1 * c - x2 * s, x2 * c + x1 * s)
        tl.store(out_row + d, tl.reshape(out, [BLOCK_H, 2 * BLOCK_HALF]).to(out_ptr.dtype.element_ty), mask=mask)
    else:  # the two contiguous halves
        mask = (heads < H) & (i < HALF)
        x1 = tl.load(x_row + i, mask=mask).to(tl.float32)
        x2 = tl.load(x_row + HALF + i, mask=mask).to(tl.float32)
        tl.store(out_row + i, (x1 * c - x2 * s).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out_row + HALF + i, (x2 * c + x1 * s).to(out_ptr.dtype.element_ty), mask=mask)


def _check(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"rope: layout must be one of {LAYOUTS}, got {layout!r}")
    if x.dim() != 3 or x.shape[-1] % 2 or positions.shape != (x.shape[0],):
        raise ValueError(f"rope: x [T, H, D even] and positions [T] expected, "
                         f"got {tuple(x.shape)} and {tuple(positions.shape)}")
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[1] != x.shape[-1] // 2:
        raise ValueError(f"rope: cos and sin must be [P, D/2={x.shape[-1] // 2}], "
                         f"got {tuple(cos.shape)} and {tuple(sin.shape)}")


@rope.single_and_batched
def rope_rows(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
              layout: str = "neox") -> torch.Tensor:
    """x [T, H, D] rotated at positions [T], one program a row (the single variant is T = 1)."""
    _check(x, positions, cos, sin, layout)
    launch.check_device("rope", x, positions, cos, sin)
    launch.check_last_dim_contiguous("rope", x=x, cos=cos, sin=sin)
    if cos.stride() != sin.stride():
        raise ValueError("rope: cos and sin tables must share strides")
    t, h, d = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    block_h, block_half = launch.next_pow2(h), launch.next_pow2(d // 2)
    replay.launch(_rope_kernel, (t,), x, positions, cos, sin, out, h, x.stride(0), x.stride(1),
               out.stride(0), out.stride(1), cos.stride(0),
               HALF=d // 2, BLOCK_H=block_h, BLOCK_HALF=block_half, INTERLEAVED=layout == "interleaved",
               num_warps=launch.warps_for(block_h * block_half * 2))
    return out


@rope.reference
def rope_reference(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   layout: str = "neox") -> torch.Tensor:
    _check(x, positions, cos, sin, layout)
    c = cos.double()[positions.long()][:, None, :]  # [T, 1, D/2]
    s = sin.double()[positions.long()][:, None, :]
    x64 = x.double()
    half = x.shape[-1] // 2
    x1, x2 = (x64[..., 0::2], x64[..., 1::2]) if layout == "interleaved" else (x64[..., :half], x64[..., half:])
    r1, r2 = x1 * c - x2 * s, x2 * c + x1 * s
    out = torch.stack([r1, r2], -1).flatten(-2) if layout == "interleaved" else torch.cat([r1, r2], -1)
    return out.to(x.dtype)
