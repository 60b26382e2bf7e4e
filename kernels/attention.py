"""attention(q [T, H, D], k_cache, v_cache, positions [T], block_table, scale) -> out [T, H, D].

Causal attention of new query rows over the KV cache (after kv_scatter wrote them): query row t
attends to cache positions 0..positions[t]. Grouped-query: head h reads KV head h // (H / H_kv).
Cache layouts: kernels/kv_cache.py.

One program serves one (query row, head). It walks the keys in blocks of BLOCK_KV = 32 from
position 0 upwards with an online softmax in fp32, masking (not loading) keys past its
position. Block size and order depend only on the row's own position, never on how many
rows arrive together, so a batched prefill chunk (T query rows at once) and one-row
decode steps agree to the bit. Tag "lse" [T, H] fp32: each row's log-sum-exp.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

import replay
from replay_kernels import kv_cache, launch
from replay.tolerance import ELEMENTWISE

BLOCK_KV = 32  # fixed: part of every row's summation order

attention = replay.op(
    "attention",
    batch_axes={"q": 0, "positions": 0, "out": 0, "lse": 0},
    tolerance=ELEMENTWISE,
    doc="Causal GQA attention of q [T, H, D] at positions [T] over a contiguous or paged KV cache; "
        "fp32 online softmax over fixed key blocks; tag 'lse' [T, H] fp32.",
    kernel_rules=replay.KernelRules(row_axis="x"),  # a program per (token, head)
)


@triton.jit
def _attention_row_kernel(q_ptr, k_cache_ptr, v_cache_ptr, pos_ptr, table_ptr, out_ptr, lse_ptr,
                          stride_qt, stride_qh, stride_ot, stride_oh, stride_page, stride_slot, stride_head,
                          H, D, PAGE, GROUP, scale,
                          BLOCK_D: tl.constexpr, BLOCK_KV: tl.constexpr, PAGED: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr + t).to(tl.int32)
    d = tl.arange(0, BLOCK_D)
    dmask = d < D
    q = tl.load(q_ptr + t * stride_qt + h * stride_qh + d, mask=dmask, other=0.0).to(tl.float32)
    head_off = (h // GROUP).to(tl.int64) * stride_head
    m = -float("inf")
    l = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for start in range(0, pos + 1, BLOCK_KV):
        key = start + tl.arange(0, BLOCK_KV)
        valid = key <= pos
        if PAGED:
            page = tl.load(table_ptr + key // PAGE, mask=valid, other=0).to(tl.int64)
            slot = page * stride_page + (key % PAGE) * stride_slot
        else:
            slot = key.to(tl.int64) * stride_slot
        kv_off = slot[:, None] + head_off + d[None, :]
        kv_mask = valid[:, None] & dmask[None, :]
        k = tl.load(k_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.where(valid, tl.sum(k * q[None, :], axis=1) * scale, -float("inf"))
        m_new = tl.maximum(m, tl.max(s, axis=0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m - m_new)
        v = tl.load(v_cache_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        l = l * alpha + tl.sum(p, axis=0)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m = m_new
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, (acc / l).to(out_ptr.dtype.element_ty), mask=dmask)
    tl.store(lse_ptr + t * H + h, m + tl.log(l))


def _check(q: torch.Tensor, positions: torch.Tensor, k_cache: torch.Tensor,
           geom: kv_cache.CacheGeometry) -> None:
    if q.dim() != 3 or q.shape[2] != geom.dim or q.shape[1] % geom.heads or q.dtype != k_cache.dtype:
        raise ValueError(f"attention: q must be [T, H (a multiple of {geom.heads}), {geom.dim}] {k_cache.dtype}, "
                         f"got {tuple(q.shape)} {q.dtype}")
    if positions.shape != (q.shape[0],):
        raise ValueError(f"attention: positions must be [T={q.shape[0]}], got {tuple(positions.shape)}")


@attention.single_and_batched
def attention_rows(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor,
                   block_table: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    """Attention of q [T, H, D], one program a (row, head) (the single variant is T = 1)."""
    scale = default_scale(q) if scale is None else scale
    geom = kv_cache.geometry("attention", k_cache, v_cache, block_table)
    _check(q, positions, k_cache, geom)
    launch.check_device("attention", q, k_cache, v_cache, positions, block_table)
    launch.check_last_dim_contiguous("attention", q=q)
    t, h, d = q.shape
    out = torch.empty((t, h, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((t, h), dtype=torch.float32, device=q.device)
    block_d = launch.next_pow2(d)
    replay.launch(_attention_row_kernel, (t, h), q, k_cache, v_cache, positions,
               block_table if geom.paged else positions, out, lse, q.stride(0), q.stride(1),
               out.stride(0), out.stride(1), geom.stride_page, geom.stride_slot, geom.stride_head,
               h, d, geom.page, h // geom.heads, scale,
               BLOCK_D=block_d, BLOCK_KV=BLOCK_KV, PAGED=geom.paged, num_warps=launch.warps_for(block_d * BLOCK_KV))
    replay.tag("lse", lse)
    return out


@attention.reference
def attention_reference(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor,
                        block_table: torch.Tensor | None = None, scale: float | None = None) -> torch.Tensor:
    geom = kv_cache.geometry("attention", k_cache, v_cache, block_table)
    _check(q, positions, k_cache, geom)
    scale = default_scale(q) if scale is None else scale
    keys = kv_cache.by_position(k_cache, block_table).double()  # [S, H_kv, D]
    values = kv_cache.by_position(v_cache, block_table).double()
    group = q.shape[1] // geom.heads
    keys, values = keys.repeat_interleave(group, 1), values.repeat_interleave(group, 1)
    scores = torch.einsum("thd,shd->ths", q.double(), keys) * scale
    allowed = torch.arange(keys.shape[0], device=q.device)[None, :] <= positions.long()[:, None]  # [T, S]
    scores = scores.masked_fill(~allowed[:, None, :], float("-inf"))
    replay.tag("lse", torch.logsumexp(scores, -1).float())
    return torch.einsum("ths,shd->thd", torch.softmax(scores, -1), values).to(q.dtype).contiguous()


def default_scale(q: torch.Tensor) -> float:
    return 1.0 / math.sqrt(q.shape[-1])
