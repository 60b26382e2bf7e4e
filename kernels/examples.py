"""A small valid call of each kernel op, for the tests and for tools that run the variants with no
recording at hand (`replay ptx OP`): `make(op, rows, dtype, device, **options)` builds one, and each
op's code paths (rope layouts, paged or contiguous caches, the indirect scatter) are registered as
its named examples (`Op.examples`)."""
from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import torch

import replay

from replay_kernels import ggml_quant
from replay_kernels.rope import rope_tables


def _randn(gen: torch.Generator, *shape: int, dtype: torch.dtype, device: str, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(dtype=dtype, device=device)


def _weights(fmt: ggml_quant.QuantFormat, n: int, k: int, seed: int, device: str) -> torch.Tensor:
    w = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.1
    return torch.from_numpy(ggml_quant.QUANTIZERS[fmt.name](w)).to(device)


def rmsnorm(gen, rows, dtype, device, hidden: int = 200) -> dict[str, Any]:
    return {"x": _randn(gen, rows, hidden, dtype=dtype, device=device),
            "weight": _randn(gen, hidden, dtype=dtype, device=device), "eps": 1e-5}


def residual_add(gen, rows, dtype, device, hidden: int = 300) -> dict[str, Any]:
    return {"x": _randn(gen, rows, hidden, dtype=dtype, device=device),
            "residual": _randn(gen, rows, hidden, dtype=dtype, device=device)}


def swiglu(gen, rows, dtype, device, width: int = 200) -> dict[str, Any]:
    return {"gate": _randn(gen, rows, width, dtype=dtype, device=device, scale=3.0),
            "up": _randn(gen, rows, width, dtype=dtype, device=device)}


def rope(gen, rows, dtype, device, layout: str = "neox", heads: int = 3, head_dim: int = 16) -> dict[str, Any]:
    cos, sin = rope_tables(4096, head_dim, device=device)
    return {"x": _randn(gen, rows, heads, head_dim, dtype=dtype, device=device),
            "positions": torch.randint(0, 4096, (rows,), generator=gen, dtype=torch.int32).to(device),
            "cos": cos, "sin": sin, "layout": layout}


def _gemv(fmt: ggml_quant.QuantFormat) -> Callable[..., dict[str, Any]]:
    def make(gen, rows, dtype, device, n: int = 40, k: int = 512) -> dict[str, Any]:
        seed = int(torch.randint(0, 2**31, (1,), generator=gen))
        return {"x": _randn(gen, rows, k, dtype=dtype, device=device), "weight": _weights(fmt, n, k, seed, device)}
    return make


def _cache(gen, dtype, device, paged: bool, heads: int, dim: int, capacity: int = 64, page: int = 8):
    """Random K/V caches, and a block table that maps logical pages to shuffled physical ones."""
    shape = (capacity // page, page, heads, dim) if paged else (capacity, heads, dim)
    table = torch.randperm(capacity // page, generator=gen).to(torch.int32).to(device) if paged else None
    return (_randn(gen, *shape, dtype=dtype, device=device), _randn(gen, *shape, dtype=dtype, device=device), table)


def kv_scatter(gen, rows, dtype, device, paged: bool = True, indirect: bool = False,
               cached: int = 5) -> dict[str, Any]:
    heads, dim = 2, 16
    k_cache, v_cache, table = _cache(gen, dtype, device, paged, heads, dim)
    positions = torch.arange(cached, cached + rows, dtype=torch.int32, device=device)
    position_buf = torch.zeros(16, dtype=torch.int32, device=device)
    if indirect:
        position_buf[:rows] = positions
    return {"k": _randn(gen, rows, heads, dim, dtype=dtype, device=device),
            "v": _randn(gen, rows, heads, dim, dtype=dtype, device=device),
            "k_cache": k_cache, "v_cache": v_cache,
            "kv_cache_lengths": torch.tensor([cached], dtype=torch.int32, device=device),
            "position_buf": position_buf,
            "seq_len_buf": torch.tensor([rows], dtype=torch.int32, device=device),
            "positions": None if indirect else positions, "block_table": table}


def attention(gen, rows, dtype, device, paged: bool = True, cached: int = 37) -> dict[str, Any]:
    k_cache, v_cache, table = _cache(gen, dtype, device, paged, heads=2, dim=16)
    return {"q": _randn(gen, rows, 4, 16, dtype=dtype, device=device), "k_cache": k_cache, "v_cache": v_cache,
            "positions": torch.arange(cached, cached + rows, dtype=torch.int32, device=device),
            "block_table": table, "scale": 0.25}


MAKERS: dict[str, Callable[..., dict[str, Any]]] = {
    "rmsnorm": rmsnorm, "residual_add": residual_add, "swiglu": swiglu, "rope": rope,
    "q4k_gemv": _gemv(ggml_quant.Q4_K), "q6k_gemv": _gemv(ggml_quant.Q6_K),
    "kv_scatter": kv_scatter, "attention": attention,
}


def make(op: str, rows: int, dtype: torch.dtype, device: str, seed: int = 0, **options: Any) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    return MAKERS[op](gen, rows, dtype, device, **options)


# op -> example name -> options: the code paths each op has
PATHS: dict[str, dict[str, dict[str, Any]]] = {
    "rmsnorm": {"default": {}}, "residual_add": {"default": {}}, "swiglu": {"default": {}},
    "rope": {"neox": {"layout": "neox"}, "interleaved": {"layout": "interleaved"}},
    "q4k_gemv": {"default": {}}, "q6k_gemv": {"default": {}},
    "kv_scatter": {"paged": {"paged": True}, "contiguous": {"paged": False},
                   "indirect": {"paged": True, "indirect": True}},
    "attention": {"paged": {"paged": True}, "contiguous": {"paged": False}},
}


def _example(op: str, options: dict[str, Any], rows: int, dtype: torch.dtype, device: str) -> dict[str, Any]:
    return make(op, rows, dtype, device, **options)


for _op, _paths in PATHS.items():
    for _name, _options in _paths.items():
        replay.get_op(_op).example(_name)(functools.partial(_example, _op, _options))
