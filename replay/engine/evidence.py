"""What a report draws of a failing comparison: small enough to keep for every failing tensor.

A tensor seen as rows (its batch axis, or its first) by columns (the rest, flattened) is cut into
at most GRID x GRID blocks; each block keeps the largest |actual - expected| in it (the heatmap).
Beside it: which rows hold a mismatch (the row map), the worst row's values on both sides (up to
VALUES of them, from its first mismatch), and a histogram of log10 |difference| over the
elements that differ.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

GRID = 48
VALUES = 16
HISTOGRAM = (-12, 4)  # log10 |difference| from 1e-12 to 1e4, a bin a decade


@dataclass
class Evidence:
    call: int
    name: str  # the tensor: 'out', 'tag rstd'
    versus: str  # 'batched vs reference'
    shape: list[int]
    heat: list[list[float]] = field(default_factory=list)  # blocks' max |diff|, rows by columns
    block: tuple[int, int] = (1, 1)  # rows and columns a heatmap cell covers
    bad_rows: list[bool] = field(default_factory=list)
    worst_row: int = 0
    columns: list[int] = field(default_factory=list)  # of the values shown
    expected: list[float] = field(default_factory=list)
    actual: list[float] = field(default_factory=list)
    histogram: list[int] = field(default_factory=list)  # counts per decade of HISTOGRAM
    beyond_range: int = 0  # differences outside it (or not finite)


def gather(call: int, name: str, versus: str, actual: torch.Tensor, expected: torch.Tensor,
           mismatching: torch.Tensor | None = None, batch_axis: int | None = None) -> Evidence | None:
    """The evidence of one failing comparison; None where the shapes differ or there are no elements
    (nothing to draw)."""
    if actual.shape != expected.shape or actual.numel() == 0:
        return None
    a, e = _rows(actual, batch_axis), _rows(expected, batch_axis)
    diff = (a - e).abs()
    both_nan = a.isnan() & e.isnan()
    diff = torch.where(both_nan | (a == e), torch.zeros_like(diff), diff).nan_to_num(nan=math.inf)
    bad = (diff > 0) if mismatching is None else _rows(mismatching.to(torch.float64), batch_axis) > 0
    found = Evidence(call, name, versus, list(actual.shape))
    rows, cols = diff.shape
    block = (max(1, math.ceil(rows / GRID)), max(1, math.ceil(cols / GRID)))
    found.block = block
    padded = torch.nn.functional.pad(diff, (0, -cols % block[1], 0, -rows % block[0]))
    pooled = padded.reshape(padded.shape[0] // block[0], block[0], padded.shape[1] // block[1], block[1])
    found.heat = pooled.amax(dim=(1, 3)).tolist()
    row_bad = bad.any(dim=1)
    found.bad_rows = row_bad.tolist()
    worst = int(diff.max(dim=1).values.argmax()) if diff.numel() else 0
    found.worst_row = worst
    first = int(bad[worst].nonzero()[0]) if bool(bad[worst].any()) else 0
    found.columns = list(range(first, min(cols, first + VALUES)))
    found.expected = e[worst, first:first + VALUES].tolist()
    found.actual = a[worst, first:first + VALUES].tolist()
    differing = diff[diff > 0]
    low, high = HISTOGRAM
    decades = torch.floor(torch.log10(differing)).clamp(min=low - 1, max=high)
    inside = (decades >= low) & (decades < high)
    found.histogram = torch.bincount((decades[inside] - low).long(), minlength=high - low).tolist()
    found.beyond_range = int((~inside).sum())
    return found


def _rows(t: torch.Tensor, batch_axis: int | None) -> torch.Tensor:
    """`t` as float64 rows by columns: its batch axis first, the rest flattened."""
    t = t.detach().cpu().to(torch.float64)
    if t.dim() == 0:
        return t.reshape(1, 1)
    axis = batch_axis if batch_axis is not None and batch_axis < t.dim() else 0
    return t.movedim(axis, 0).reshape(t.shape[axis], -1)


def to_json(found: Evidence) -> dict[str, Any]:
    return dict(found.__dict__)
