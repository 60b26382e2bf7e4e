"""kv_scatter: write T new K/V rows into the KV cache and advance kv_cache_lengths.

    kv_scatter(k [T, H_kv, D], v [T, H_kv, D], k_cache, v_cache, kv_cache_lengths [1],
               position_buf [>=T], seq_len_buf [1], positions [T] | None, block_table | None) -> None

Row t goes to position positions[t] (the direct path: positions computed for this call, as a
prefill does) or, when positions is None, to position_buf[t] (the indirect path: a
persistent device buffer the host fills before replaying a captured CUDA graph, as a decode
step does). Then kv_cache_lengths[0] += seq_len_buf[0]. The launch record's `path` says
which positions the kernel read, and every variant tags the positions it wrote as
"positions". Cache layouts: kernels/kv_cache.py.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
import triton
import triton.language as tl

import replay
from replay_kernels import kv_cache, launch
from replay.tolerance import EXACT


def split_row(args: dict[str, Any], r: int) -> dict[str, Any]:
    """The one-token call that writes row r, as a decode step would (seq_len_buf = 1)."""
    row = dict(args)
    row["k"], row["v"] = args["k"][r:r + 1], args["v"][r:r + 1]
    if args.get("positions") is not None:
        row["positions"] = args["positions"][r:r + 1]
    else:
        row["position_buf"] = args["position_buf"][r:r + 1]
    row["seq_len_buf"] = torch.ones_like(args["seq_len_buf"])
    return row


kv_scatter = replay.op(
    "kv_scatter",
    batch_axes={"k": 0, "v": 0, "positions": 0},
    state=("position_buf", "seq_len_buf", "kv_cache_lengths"),
    mutates=("k_cache", "v_cache", "kv_cache_lengths"),
    tolerance=EXACT,
    serial_rows=True,
    split_row=split_row,
    doc="Write K/V rows [T, H_kv, D] at positions (direct) or position_buf[:T] (indirect) into a "
        "contiguous or paged cache; kv_cache_lengths += seq_len_buf; tag 'positions' [T] int32.",
    kernel_rules=replay.KernelRules(row_axis="x", ignore_when_given={"positions": ("position_buf",)}),
)


@triton.jit
def _kv_scatter_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, lengths_ptr, src_pos_ptr, seq_len_ptr,
                       table_ptr, written_ptr, stride_kt, stride_kh, stride_vt, stride_vh,
                       stride_page, stride_slot, stride_head, H, D, PAGE,
                       BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, PAGED: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.load(src_pos_ptr + t).to(tl.int64)
    tl.store(written_ptr + t, pos.to(tl.int32))
    if PAGED:
        page = tl.load(table_ptr + pos // PAGE).to(tl.int64)
        dest = page * stride_page + (pos % PAGE) * stride_slot
    else:
        dest = pos * stride_slot
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < H) & (d < D)
    k = tl.load(k_ptr + t.to(tl.int64) * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(v_ptr + t.to(tl.int64) * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(k_cache_ptr + dest + h * stride_head + d, k, mask=mask)
    tl.store(v_cache_ptr + dest + h * stride_head + d, v, mask=mask)
    if t == 0:
        tl.store(lengths_ptr, tl.load(lengths_ptr) + tl.load(seq_len_ptr))


def _check(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, position_buf: torch.Tensor,
           positions: torch.Tensor | None, geom: kv_cache.CacheGeometry) -> None:
    t = k.shape[0]
    if k.shape != v.shape or k.shape[1:] != (geom.heads, geom.dim) or k.dtype != k_cache.dtype:
        raise ValueError(f"kv_scatter: k and v must be [T, {geom.heads}, {geom.dim}] {k_cache.dtype}, "
                         f"got {tuple(k.shape)} {k.dtype} and {tuple(v.shape)}")
    if positions is not None and positions.shape != (t,):
        raise ValueError(f"kv_scatter: positions must be [T={t}], got {tuple(positions.shape)}")
    if positions is None and (position_buf.dim() != 1 or position_buf.shape[0] < t):
        raise ValueError(f"kv_scatter: indirect path needs position_buf [>= T={t}], got {tuple(position_buf.shape)}")


def scatter(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
            kv_cache_lengths: torch.Tensor, position_buf: torch.Tensor, seq_len_buf: torch.Tensor,
            positions: torch.Tensor | None, block_table: torch.Tensor | None, *, indirect: bool) -> None:
    """Launch the scatter kernel; `indirect` reads positions from position_buf, else from positions."""
    geom = kv_cache.geometry("kv_scatter", k_cache, v_cache, block_table)
    _check(k, v, k_cache, position_buf, None if indirect else positions, geom)
    launch.check_device("kv_scatter", k, v, k_cache, v_cache, kv_cache_lengths, position_buf, seq_len_buf,
                        positions, block_table)
    launch.check_last_dim_contiguous("kv_scatter", k=k, v=v)
    t = k.shape[0]
    written = torch.empty(t, dtype=torch.int32, device=k.device)
    source = position_buf if indirect else positions
    replay.launch(_kv_scatter_kernel, (t,), k, v, k_cache, v_cache, kv_cache_lengths, source, seq_len_buf,
               block_table if geom.paged else source, written, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
               geom.stride_page, geom.stride_slot, geom.stride_head, geom.heads, geom.dim, geom.page,
               BLOCK_H=launch.next_pow2(geom.heads), BLOCK_D=launch.next_pow2(geom.dim), PAGED=geom.paged,
               num_warps=1, path="indirect" if indirect else "direct")
    replay.tag("positions", written)


@kv_scatter.reference
def kv_scatter_reference(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         kv_cache_lengths: torch.Tensor, position_buf: torch.Tensor, seq_len_buf: torch.Tensor,
                         positions: torch.Tensor | None = None, block_table: torch.Tensor | None = None) -> None:
    geom = kv_cache.geometry("kv_scatter", k_cache, v_cache, block_table)
    _check(k, v, k_cache, position_buf, positions, geom)
    written = positions if positions is not None else position_buf[:k.shape[0]]
    replay.tag("positions", written.to(torch.int32))
    k_cache[kv_cache.rows_at(k_cache, block_table, written)] = k
    v_cache[kv_cache.rows_at(v_cache, block_table, written)] = v
    kv_cache_lengths += seq_len_buf.to(kv_cache_lengths.dtype)


@kv_scatter.single_and_batched
def kv_scatter_rows(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    kv_cache_lengths: torch.Tensor, position_buf: torch.Tensor, seq_len_buf: torch.Tensor,
                    positions: torch.Tensor | None = None, block_table: torch.Tensor | None = None) -> None:
    """Scatter T rows (the single variant: T = 1, a decode step), directly when positions are given."""
    scatter(k, v, k_cache, v_cache, kv_cache_lengths, position_buf, seq_len_buf, positions, block_table,
            indirect=positions is None)


@kv_scatter.contract
def positions_follow_lengths(inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> list[str]:
    """Rows land at kv_cache_lengths-before + arange(T); lengths advance by seq_len_buf."""
    t = inputs["k"].shape[0]
    before = int(inputs["kv_cache_lengths"].reshape(-1)[0])
    seq_len = int(inputs["seq_len_buf"].reshape(-1)[0])
    expected = list(range(before, before + t))
    violations = []
    if seq_len != t:
        violations.append(f"seq_len_buf holds {seq_len} but the call writes {t} row(s)")
    after = int(outputs["kv_cache_lengths"].reshape(-1)[0])
    if after != before + seq_len:
        violations.append(f"kv_cache_lengths went from {before} to {after}, expected {before} + seq_len_buf "
                          f"{seq_len} = {before + seq_len}")
    if inputs.get("positions") is None:
        held = inputs["position_buf"][:t].tolist()
        if held != expected:
            violations.append(f"stale position_buf: it holds positions {held} but kv_cache_lengths before "
                              f"({before}) + arange({t}) expects {expected}")
    elif inputs["positions"].tolist() != expected:
        violations.append(f"positions {inputs['positions'].tolist()} given, but kv_cache_lengths before "
                          f"({before}) + arange({t}) expects {expected}")
    found, misplaced = _rows_written(inputs, outputs)
    if found != expected or misplaced:
        held = f" (rows {misplaced} are not the rows given for them)" if found == expected else ""
        violations.append(f"K/V rows found written at positions {found} but kv_cache_lengths before "
                          f"({before}) + arange({t}) expects {expected}{held}")
    return violations


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A float tensor's stored bits as integers of its width, so that equal means the same bits."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _rows_written(inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> tuple[list[int], list[int]]:
    """(positions whose K or V row the call changed or that hold their row, rows not at their position).

    Row t belongs at position kv_cache_lengths-before + t; a slot left unchanged still counts
    where it already held the new row (rewriting equal data).
    """
    table = inputs.get("block_table")
    old = [_bits(kv_cache.by_position(inputs[n], table)) for n in ("k_cache", "v_cache")]
    new = [_bits(kv_cache.by_position(outputs[n], table)) for n in ("k_cache", "v_cache")]
    changed = ((old[0] != new[0]) | (old[1] != new[1])).flatten(1).any(1)
    found = set(torch.nonzero(changed.cpu()).flatten().tolist())
    before = int(inputs["kv_cache_lengths"].reshape(-1)[0])
    misplaced = []
    for row in range(inputs["k"].shape[0]):
        p = before + row
        if p < new[0].shape[0] and torch.equal(new[0][p], _bits(inputs["k"][row])) \
                and torch.equal(new[1][p], _bits(inputs["v"][row])):
            found.add(p)
        else:
            misplaced.append(row)
    return sorted(found), misplaced
