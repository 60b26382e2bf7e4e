"""The model's kernels: three Triton kernels registered as ops, and a plain-torch function captured."""
import torch
import triton
import triton.language as tl

import replay

norm = replay.op("norm", batch_axes={"x": 0, "out": 0})
rotary = replay.op("rotary", batch_axes={"x": 0, "out": 0, "position_buf": 0}, state=("position_buf",))
scaled_add = replay.op("scaled_add", batch_axes={"x": 0, "y": 0, "out": 0})


@triton.jit
def _norm_kernel(x_ptr, w_ptr, out_ptr, H, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * H + cols, x * rstd * w, mask=mask)


@norm.single_and_batched
def norm_rows(x, weight, eps):
    out = torch.empty_like(x)
    _norm_kernel[(x.shape[0],)](x, weight, out, x.shape[1], eps, BLOCK=triton.next_power_of_2(x.shape[1]))
    return out


@norm.reference
def norm_reference(x, weight, eps):
    x64 = x.double()
    return (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * weight.double()).float()


@triton.jit
def _rotary_kernel(x_ptr, pos_ptr, out_ptr, HALF: tl.constexpr, theta):
    row = tl.program_id(0)
    i = tl.arange(0, HALF)
    pos = tl.load(pos_ptr + row).to(tl.float32)
    angle = pos * tl.exp(-(2.0 * i / (2 * HALF)) * tl.log(theta))
    c = tl.cos(angle)
    s = tl.sin(angle)
    x1 = tl.load(x_ptr + row * 2 * HALF + i)
    x2 = tl.load(x_ptr + row * 2 * HALF + HALF + i)
    tl.store(out_ptr + row * 2 * HALF + i, x1 * c - x2 * s)
    tl.store(out_ptr + row * 2 * HALF + HALF + i, x2 * c + x1 * s)


@rotary.single_and_batched
def rotary_rows(x, position_buf, theta=10000.0):
    out = torch.empty_like(x)
    _rotary_kernel[(x.shape[0],)](x, position_buf, out, HALF=x.shape[1] // 2, theta=theta)
    replay.tag("angle0", position_buf.float())
    return out


@rotary.reference
def rotary_reference(x, position_buf, theta=10000.0):
    half = x.shape[1] // 2
    inv = theta ** (-2.0 * torch.arange(half, dtype=torch.float64, device=x.device) / (2 * half))
    angle = position_buf.double()[:, None] * inv[None, :]
    x1, x2 = x[:, :half].double(), x[:, half:].double()
    replay.tag("angle0", position_buf.float())
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin()], 1).float()


@triton.jit
def _scaled_add_kernel(x_ptr, y_ptr, out_ptr, N, alpha, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + alpha * y, mask=mask)


@scaled_add.single_and_batched
def scaled_add_rows(x, y, alpha):
    out = torch.empty_like(x)
    n = x.numel()
    _scaled_add_kernel[(triton.cdiv(n, 64),)](x, y, out, n, alpha, BLOCK=64)
    return out


@scaled_add.reference
def scaled_add_reference(x, y, alpha):
    return (x.double() + alpha * y.double()).float()


@replay.capture("softcap", variant="batched")
def softcap(x, cap):
    """Plain PyTorch, recorded as it is."""
    return cap * torch.tanh(x / cap)
