"""ggml's Q4_K and Q6_K super-block formats: a numpy quantiser and the reference dequantiser.

Byte layouts are ggml's (QK_K = 256 weights per super-block, little-endian):

    Q4_K, 144 bytes: fp16 d | fp16 dmin | 12 bytes of 6-bit scales and mins | 128 bytes of 4-bit quants
        weight = (d * scale_s) * q - (dmin * min_s), s = the 32-weight sub-block
    Q6_K, 210 bytes: 128 bytes ql (low 4 bits) | 64 bytes qh (high 2 bits) | 16 int8 scales | fp16 d
        weight = (d * scale_s) * (q - 32), s = the 16-weight sub-block

A quantised matrix of N rows and K columns is a uint8 tensor [N, K // 256 * block_bytes]: each
row is its super-blocks back to back, so real GGUF tensor data can be used as is.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

QK_K = 256


@dataclass(frozen=True)
class QuantFormat:
    name: str
    block_bytes: int
    sub_block: int  # weights sharing one scale


Q4_K = QuantFormat("Q4_K", 144, 32)
Q6_K = QuantFormat("Q6_K", 210, 16)


def columns_of(weight: torch.Tensor, fmt: QuantFormat) -> int:
    """K, the number of weights per row, of a quantised [N, row_bytes] matrix."""
    if weight.dtype != torch.uint8 or weight.dim() != 2 or weight.shape[1] % fmt.block_bytes:
        raise ValueError(f"{fmt.name} weight must be uint8 [N, K/256*{fmt.block_bytes}], "
                         f"got {weight.dtype} {tuple(weight.shape)}")
    return weight.shape[1] // fmt.block_bytes * QK_K


# --------------------------------------------------------------------------- quantisers (numpy)

def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape, np.float32), where=b > 0)


def _fp16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype("<f2").view(np.uint8).reshape(*v.shape, 2)


def quantize_q4_k(w: np.ndarray) -> np.ndarray:
    """Quantise float [N, K] (K a multiple of 256) to Q4_K bytes [N, K/256*144].

    Min/max per 32-weight sub-block, scales and mins rounded to 6 bits against the
    super-block's fp16 d and dmin (simpler than ggml's search, same format).
    """
    n, k = _check_shape(w)
    x = w.astype(np.float32).reshape(n, k // QK_K, 8, 32)
    low = np.minimum(x.min(-1), 0.0)  # ggml's mins are subtracted, so never positive
    scale, minimum = (x.max(-1) - low) / 15.0, -low
    d = (scale.max(-1) / 63.0).astype(np.float16)
    dmin = (minimum.max(-1) / 63.0).astype(np.float16)
    sc = np.clip(np.rint(_safe_div(scale, d.astype(np.float32)[..., None])), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(_safe_div(minimum, dmin.astype(np.float32)[..., None])), 0, 63).astype(np.uint8)
    step = d.astype(np.float32)[..., None] * sc
    offset = dmin.astype(np.float32)[..., None] * mn
    q = np.clip(np.rint(_safe_div(x + offset[..., None], step[..., None])), 0, 15).astype(np.uint8)

    blocks = np.zeros((n, k // QK_K, Q4_K.block_bytes), np.uint8)
    blocks[..., 0:2] = _fp16_bytes(d)
    blocks[..., 2:4] = _fp16_bytes(dmin)
    blocks[..., 4:16] = pack_q4_k_scales(sc, mn)
    # byte c*32+l holds sub-block 2c (low nibble) and 2c+1 (high nibble) at position l
    blocks[..., 16:] = (q[..., 0::2, :] | (q[..., 1::2, :] << 4)).reshape(n, k // QK_K, 128)
    return blocks.reshape(n, -1)


def pack_q4_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """Eight 6-bit scales and eight 6-bit mins [..., 8] into ggml's 12 bytes [..., 12]."""
    sc, mn = sc.astype(np.uint8), mn.astype(np.uint8)
    out = np.zeros((*sc.shape[:-1], 12), np.uint8)
    out[..., 0:4] = sc[..., :4] | ((sc[..., 4:] >> 4) << 6)
    out[..., 4:8] = mn[..., :4] | ((mn[..., 4:] >> 4) << 6)
    out[..., 8:12] = (sc[..., 4:] & 0xF) | ((mn[..., 4:] & 0xF) << 4)
    return out


def quantize_q6_k(w: np.ndarray) -> np.ndarray:
    """Quantise float [N, K] (K a multiple of 256) to Q6_K bytes [N, K/256*210].

    Symmetric per 16-weight sub-block (|max| / 31), int8 scales against the fp16 d.
    """
    n, k = _check_shape(w)
    nb = k // QK_K
    x = w.astype(np.float32).reshape(n, nb, 16, 16)
    scale = np.abs(x).max(-1) / 31.0
    d = (scale.max(-1) / 127.0).astype(np.float16)
    sc = np.clip(np.rint(_safe_div(scale, d.astype(np.float32)[..., None])), 0, 127).astype(np.int8)
    step = d.astype(np.float32)[..., None] * sc
    q = (np.clip(np.rint(_safe_div(x, step[..., None])), -32, 31) + 32).astype(np.uint8)
    q = q.reshape(n, nb, 2, 4, 32)  # half, quarter g, position l: weight half*128 + g*32 + l

    blocks = np.zeros((n, nb, Q6_K.block_bytes), np.uint8)
    ql = (q[:, :, :, 0:2] & 0xF) | ((q[:, :, :, 2:4] & 0xF) << 4)  # quarters g and g+2 share a byte
    qh = sum(((q[:, :, :, g] >> 4) & 3) << (2 * g) for g in range(4)).astype(np.uint8)
    blocks[..., 0:128] = ql.reshape(n, nb, 128)
    blocks[..., 128:192] = qh.reshape(n, nb, 64)
    blocks[..., 192:208] = sc.view(np.uint8)
    blocks[..., 208:210] = _fp16_bytes(d)
    return blocks.reshape(n, -1)


def _check_shape(w: np.ndarray) -> tuple[int, int]:
    if w.ndim != 2 or w.shape[1] % QK_K:
        raise ValueError(f"quantise needs [N, K] with K a multiple of {QK_K}, got {w.shape}")
    return w.shape


# --------------------------------------------------------------------------- dequantisers (torch)

def _fp16_field(blocks: torch.Tensor, at: int) -> torch.Tensor:
    return blocks[..., at:at + 2].contiguous().view(torch.float16).float()  # [..., 1]


def q4_k_scales_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's get_scale_min_k4 for j = 0..7: 12 packed bytes [..., 12] -> (scales, mins) [..., 8]."""
    b = packed.to(torch.int32)
    sc = torch.cat([b[..., 0:4] & 63, (b[..., 8:12] & 0xF) | ((b[..., 0:4] >> 6) << 4)], -1)
    mn = torch.cat([b[..., 4:8] & 63, (b[..., 8:12] >> 4) | ((b[..., 4:8] >> 6) << 4)], -1)
    return sc, mn


def dequantize_q4_k(weight: torch.Tensor) -> torch.Tensor:
    """Q4_K bytes [N, K/256*144] -> fp32 [N, K], as ggml's dequantize_row_q4_K computes it."""
    n, k = weight.shape[0], columns_of(weight, Q4_K)
    blocks = weight.reshape(n, k // QK_K, Q4_K.block_bytes)
    d, dmin = _fp16_field(blocks, 0), _fp16_field(blocks, 2)
    sc, mn = q4_k_scales_mins(blocks[..., 4:16])
    d1, m1 = d * sc.float(), dmin * mn.float()  # [N, nb, 8]
    qs = blocks[..., 16:].reshape(n, k // QK_K, 4, 1, 32).to(torch.int32)
    q = torch.cat([qs & 0xF, qs >> 4], dim=3).reshape(n, k // QK_K, 8, 32)  # sub-block 2c, 2c+1
    return (d1[..., None] * q.float() - m1[..., None]).reshape(n, k)


def dequantize_q6_k(weight: torch.Tensor) -> torch.Tensor:
    """Q6_K bytes [N, K/256*210] -> fp32 [N, K], as ggml's dequantize_row_q6_K computes it."""
    n, k = weight.shape[0], columns_of(weight, Q6_K)
    nb = k // QK_K
    blocks = weight.reshape(n, nb, Q6_K.block_bytes)
    ql = blocks[..., 0:128].reshape(n, nb, 2, 1, 2, 32).to(torch.int32)  # half, -, byte group, l
    qh = blocks[..., 128:192].reshape(n, nb, 2, 1, 32).to(torch.int32)
    low = torch.cat([ql & 0xF, ql >> 4], dim=3).reshape(n, nb, 2, 4, 32)  # quarter g = nibble*2 + group
    shifts = torch.arange(0, 8, 2, device=weight.device).view(1, 1, 1, 4, 1)
    q = (low | (((qh >> shifts) & 3) << 4)) - 32
    sc = blocks[..., 192:208].contiguous().view(torch.int8).float()  # [N, nb, 16]
    d = _fp16_field(blocks, 208)
    scale = (d * sc).repeat_interleave(Q6_K.sub_block, dim=-1)  # weight j uses scale j // 16
    return (scale * q.reshape(n, nb, QK_K).float()).reshape(n, k)


DEQUANTIZERS = {Q4_K.name: dequantize_q4_k, Q6_K.name: dequantize_q6_k}
QUANTIZERS = {Q4_K.name: quantize_q4_k, Q6_K.name: quantize_q6_k}
