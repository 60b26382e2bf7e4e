"""The Q4_K / Q6_K byte layouts against blocks built and decoded by hand, and the quantiser."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from replay_kernels import ggml_quant
from replay_kernels.ggml_quant import Q4_K, Q6_K
from replay_kernels.kquant.matmul import kquant_matmul


def _fp16_bytes(value: float) -> list[int]:
    return list(np.array([value], "<f2").view(np.uint8))


def _hand_q4_k_block() -> tuple[np.ndarray, list[int], list[int], float, float]:
    """A block whose scales use the split 6-bit encoding, and its decoded scales and mins."""
    d, dmin = 0.5, 0.25
    sc = [1, 2, 3, 4, 17, 33, 50, 63]
    mn = [0, 1, 5, 9, 16, 31, 47, 62]
    packed = [0] * 12
    for j in range(4):  # ggml: low 6 bits in bytes 0-7, sub-blocks 4-7 split over bytes 8-11 and the top bits
        packed[j] = sc[j] | ((sc[j + 4] >> 4) << 6)
        packed[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6)
        packed[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4)
    qs = [(i * 7 + 3) % 256 for i in range(128)]
    block = np.array(_fp16_bytes(d) + _fp16_bytes(dmin) + packed + qs, np.uint8)
    return block, sc, mn, d, dmin


def test_q4_k_block_decodes_as_ggml_by_hand():
    block, sc, mn, d, dmin = _hand_q4_k_block()
    assert block.size == 144
    got = ggml_quant.dequantize_q4_k(torch.from_numpy(block)[None]).numpy()[0]
    qs = block[16:]
    for j in range(256):  # element j: chunk j // 64, low nibble in its first 32, high in its last
        chunk, within = divmod(j, 64)
        byte = int(qs[chunk * 32 + within % 32])
        q = byte & 0xF if within < 32 else byte >> 4
        s = j // 32
        assert got[j] == np.float32(np.float32(d * sc[s]) * q - np.float32(dmin * mn[s])), j
    # two values worked out on paper: byte 0 = 3, sub-block 0 (sc 1, min 0); byte 0 high nibble
    # in sub-block 1 (sc 2, min 1): 0.5*2*0 - 0.25*1
    assert got[0] == 1.5 and got[32] == -0.25
    assert got[255] == np.float32(0.5 * 63 * (((127 * 7 + 3) % 256) >> 4) - 0.25 * 62)


def test_q4_k_scale_packing_round_trips():
    _, sc, mn, _, _ = _hand_q4_k_block()
    packed = ggml_quant.pack_q4_k_scales(np.array(sc), np.array(mn))
    got_sc, got_mn = ggml_quant.q4_k_scales_mins(torch.from_numpy(packed))
    assert got_sc.tolist() == sc and got_mn.tolist() == mn


def test_q6_k_block_decodes_as_ggml_by_hand():
    d = 0.125
    ql = [(i * 11 + 5) % 256 for i in range(128)]
    qh = [(i * 37 + 1) % 256 for i in range(64)]
    scales = [-128, -7, 0, 1, 5, 17, 33, 64, 100, 127, -1, -64, 9, 3, 2, 77]
    block = np.array(ql + qh + list(np.array(scales, np.int8).view(np.uint8)) + _fp16_bytes(d), np.uint8)
    assert block.size == 210
    got = ggml_quant.dequantize_q6_k(torch.from_numpy(block)[None]).numpy()[0]
    for j in range(256):  # ggml's loop: half n, lane l, quarter g
        n, rest = divmod(j, 128)
        g, l = divmod(rest, 32)
        low = ql[n * 64 + (g % 2) * 32 + l]
        low = low & 0xF if g < 2 else low >> 4
        q = (low | (((qh[n * 32 + l] >> (2 * g)) & 3) << 4)) - 32
        assert got[j] == np.float32(np.float32(d * scales[j // 16]) * q), j
    # ql[0] = 5, qh[0] = 1: q = 5 | (1 << 4) = 21 - 32 = -11, scale -128 -> 0.125 * -128 * -11
    assert got[0] == 176.0


@pytest.mark.parametrize("fmt", [Q4_K, Q6_K], ids=lambda f: f.name)
def test_quantiser_round_trip_error_is_within_half_a_step(fmt):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 512)).astype(np.float32)
    w[0, :256] = 0.0  # an all-zero super-block must not divide by zero
    blocks = ggml_quant.QUANTIZERS[fmt.name](w)
    assert blocks.shape == (8, 2 * fmt.block_bytes) and blocks.dtype == np.uint8
    back = ggml_quant.DEQUANTIZERS[fmt.name](torch.from_numpy(blocks)).numpy()
    assert np.all(back[0, :256] == 0.0)
    groups = w.reshape(8, -1, fmt.sub_block)
    span = groups.max(-1) - np.minimum(groups.min(-1), 0) if fmt == Q4_K else 2 * np.abs(groups).max(-1)
    levels = 15 if fmt == Q4_K else 62
    # half a quantisation step, plus the scale's own 6/8-bit rounding (a few percent of the span)
    bound = span / levels * 0.5 + span * 0.04
    assert np.all(np.abs(back - w).reshape(groups.shape) <= bound[..., None] + 1e-6)


@pytest.mark.parametrize("fmt", [Q4_K, Q6_K], ids=lambda f: f.name)
def test_kernel_dequantises_bit_exactly_like_the_reference(fmt, dev):
    # x = unit vectors: each output is one dequantised weight, summed with exact zeros
    k = 768  # three super-blocks: the second K step is half masked
    weight = torch.from_numpy(ggml_quant.QUANTIZERS[fmt.name](
        np.random.default_rng(1).standard_normal((24, k)).astype(np.float32))).to(dev)
    picks = torch.arange(0, k, 37)
    x = torch.eye(k, device=dev)[picks].contiguous()
    out = kquant_matmul(x, weight, fmt, block_m=8)
    expected = ggml_quant.DEQUANTIZERS[fmt.name](weight)[:, picks.to(dev)].T
    assert torch.equal(out, expected)


@pytest.mark.parametrize("offset", [1, 2], ids=lambda o: f"offset{o}")
@pytest.mark.parametrize("fmt", [Q4_K, Q6_K], ids=lambda f: f.name)
def test_kernel_reads_weights_that_start_off_a_word_boundary(fmt, offset, dev):
    # a weight viewed out of a larger byte buffer: the kernel's word loads must not care
    weight = torch.from_numpy(ggml_quant.QUANTIZERS[fmt.name](
        np.random.default_rng(2).standard_normal((6, 512)).astype(np.float32))).to(dev)
    buffer = torch.zeros(weight.numel() + offset, dtype=torch.uint8, device=dev)
    shifted = buffer[offset:].view(weight.shape)
    shifted.copy_(weight)
    assert shifted.data_ptr() % 4 == offset
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(2)).to(dev)
    assert torch.equal(kquant_matmul(x, shifted, fmt, block_m=4), kquant_matmul(x, weight, fmt, block_m=4))


@pytest.mark.parametrize("fmt", [Q4_K, Q6_K], ids=lambda f: f.name)
def test_kernel_reads_bf16_x_that_starts_off_a_word_boundary(fmt, dev):
    # bf16 x is read two values a word: an x viewed one element into a buffer must give the same bits
    weight = torch.from_numpy(ggml_quant.QUANTIZERS[fmt.name](
        np.random.default_rng(3).standard_normal((6, 512)).astype(np.float32))).to(dev)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).to(dev)
    buffer = torch.zeros(x.numel() + 1, dtype=torch.bfloat16, device=dev)
    shifted = buffer[1:].view(x.shape)
    shifted.copy_(x)
    assert shifted.data_ptr() % 4 == 2
    assert torch.equal(kquant_matmul(shifted, weight, fmt, block_m=4), kquant_matmul(x, weight, fmt, block_m=4))


def test_weight_of_wrong_width_is_rejected():
    with pytest.raises(ValueError, match="Q6_K weight must be uint8"):
        ggml_quant.columns_of(torch.zeros(4, 144, dtype=torch.uint8), Q6_K)
