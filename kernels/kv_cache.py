"""KV cache geometry shared by kv_scatter and attention: contiguous or paged, one sequence.

- contiguous: cache [S, H_kv, D]; position p lives at cache[p].
- paged: cache [pages, PAGE, H_kv, D] with block_table [max_pages] (int32): position p
  lives at cache[block_table[p // PAGE], p % PAGE].
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CacheGeometry:
    """What a kernel needs to address a cache: strides in elements, page size, heads, dim."""

    paged: bool
    page: int
    stride_page: int
    stride_slot: int
    stride_head: int
    heads: int
    dim: int


def geometry(op: str, k_cache: torch.Tensor, v_cache: torch.Tensor,
             block_table: torch.Tensor | None) -> CacheGeometry:
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride() or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"{op}: k_cache and v_cache must share shape, strides and dtype, got "
                         f"{tuple(k_cache.shape)}/{k_cache.stride()}/{k_cache.dtype} and "
                         f"{tuple(v_cache.shape)}/{v_cache.stride()}/{v_cache.dtype}")
    if k_cache.stride(-1) != 1:
        raise ValueError(f"{op}: cache must be contiguous in its last dimension, strides {k_cache.stride()}")
    if block_table is None:
        if k_cache.dim() != 3:
            raise ValueError(f"{op}: contiguous cache must be [S, H_kv, D], got {tuple(k_cache.shape)}")
        return CacheGeometry(False, 1, 0, k_cache.stride(0), k_cache.stride(1), k_cache.shape[1], k_cache.shape[2])
    if k_cache.dim() != 4 or block_table.dim() != 1:
        raise ValueError(f"{op}: paged cache must be [pages, PAGE, H_kv, D] with block_table [max_pages], "
                         f"got {tuple(k_cache.shape)} and {tuple(block_table.shape)}")
    return CacheGeometry(True, k_cache.shape[1], k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                         k_cache.shape[2], k_cache.shape[3])


def rows_at(cache: torch.Tensor, block_table: torch.Tensor | None, positions: torch.Tensor) -> tuple:
    """An index into `cache` selecting the [H_kv, D] rows of `positions` (reads and writes)."""
    positions = positions.long()
    if block_table is None:
        return (positions,)
    page = cache.shape[1]
    return (block_table.long()[positions // page], positions % page)


def by_position(cache: torch.Tensor, block_table: torch.Tensor | None) -> torch.Tensor:
    """The cache as [positions, H_kv, D] in position order (a copy when paged)."""
    if block_table is None:
        return cache
    return cache[block_table.long()].flatten(0, 1)
