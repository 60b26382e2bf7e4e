"""Small pure-torch ops that exercise the engine without Triton.

TOY_BUG (environment) plants a bug at call time: 'rows' (batched rows 1.. wrong),
'stale' (batched scatter reads a stale position_buf), 'race' (nondeterministic
batched output).
"""
from __future__ import annotations

import os

import torch

import replay


def _bug(name: str) -> bool:
    return os.environ.get("TOY_BUG") == name


rowscale = replay.op("toy_rowscale", batch_axes={"x": 0, "out": 0, "scaled": 0})


@rowscale.reference
def rowscale_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    replay.tag("scaled", x.double() * 2)
    return (x.double() * 2 * w.double()).to(x.dtype)


@rowscale.single
def rowscale_single(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    replay.tag("scaled", x * 2)
    return x * 2 * w


@rowscale.batched
def rowscale_batched(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    scaled = x * 2
    if _bug("rows"):
        scaled[1:] += 1
    replay.tag("scaled", scaled)
    out = scaled * w
    if _bug("race"):
        out = out + torch.rand_like(out) * 1e-3
    return out


def _scatter_row(args: dict, row: int) -> dict:
    one = dict(args)
    one["k"] = args["k"][row:row + 1]
    one["positions"] = args["positions"][row:row + 1]
    one["position_buf"] = args["position_buf"][row:row + 1]
    one["seq_len_buf"] = torch.ones_like(args["seq_len_buf"])
    return one


scatter = replay.op("toy_scatter", batch_axes={"k": 0, "positions": 0}, serial_rows=True,
                    state=("position_buf", "seq_len_buf", "kv_cache_lengths"),
                    mutates=("cache", "kv_cache_lengths"), split_row=_scatter_row)


def _write(k, cache, kv_cache_lengths, seq_len_buf, positions):
    replay.tag("positions", positions)
    cache[positions.long()] = k
    kv_cache_lengths += seq_len_buf


@scatter.reference
def scatter_reference(k, cache, kv_cache_lengths, seq_len_buf, position_buf, positions):
    expected = kv_cache_lengths[0] + torch.arange(int(seq_len_buf[0]), dtype=torch.int32, device=k.device)
    _write(k, cache, kv_cache_lengths, seq_len_buf, expected)


@scatter.single
def scatter_single(k, cache, kv_cache_lengths, seq_len_buf, position_buf, positions):
    own = kv_cache_lengths[0:1].clone()
    _write(k, cache, kv_cache_lengths, seq_len_buf, own)


@scatter.batched
def scatter_batched(k, cache, kv_cache_lengths, seq_len_buf, position_buf, positions):
    _write(k, cache, kv_cache_lengths, seq_len_buf, position_buf if _bug("stale") else positions)


@scatter.contract
def positions_follow_lengths(inputs, outputs) -> list[str]:
    n = int(inputs["seq_len_buf"][0])
    expected = inputs["kv_cache_lengths"][0] + torch.arange(n, dtype=torch.int32)
    written = outputs.get("positions")
    if written is not None and not torch.equal(written.cpu().to(torch.int32), expected):
        return [f"positions written {written.tolist()} but kv_cache_lengths implies {expected.tolist()}"]
    return []


def record_scatter(path, tokens: int = 6) -> None:
    """A prefill of `tokens` rows: position_buf is stale (zeros), as before any decode step."""
    cache = torch.zeros(16, 4)
    lengths = torch.zeros(1, dtype=torch.int32)
    with replay.recording(path):
        scatter_batched(torch.randn(tokens, 4), cache, lengths, torch.tensor([tokens], dtype=torch.int32),
                        torch.zeros(tokens, dtype=torch.int32), torch.arange(tokens, dtype=torch.int32))


def record_rowscale(path, calls: int = 3, rows: int = 8, **options) -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(16, generator=gen)
    with replay.recording(path, **options):
        for _ in range(calls):
            rowscale_batched(torch.randn(rows, 16, generator=gen), w)
