"""Comparing a tensor with its oracle: bitwise, ULP distance, tolerance metrics, bad rows."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
import torch

from replay import metrics
from replay.metrics import Metric
from replay.tolerance import Tolerance

# float formats whose bit patterns, read as integers, order like the values (the ULP distance)
_ULP_DTYPES = frozenset({torch.float64, torch.float32, torch.float16, torch.bfloat16})
_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bit_pattern(t: torch.Tensor) -> torch.Tensor:
    """A float tensor's stored bits as integers of its width (other dtypes as they are), so that
    NaN == NaN and -0.0 != 0.0 compare as stored."""
    if t.dtype.is_floating_point:
        return t.contiguous().view(_INT_OF_WIDTH[t.element_size()])
    return t


@dataclass
class Comparison:
    """How `actual` differs from `expected` (both tensors of one name)."""

    bitwise_equal: bool
    passed: bool
    numel: int
    mismatches: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    nmse: float = 0.0
    cosine: float = 1.0
    max_ulp: int | None = None
    rel_diff: float = 0.0
    beyond: float = 0.0  # share of elements more than one thousandth off (replay/metrics.py)
    finite_agree: bool = True  # NaN and infinities where the oracle has them, and only there
    metric: str | None = None  # the rule `passed` follows when not the element-wise tolerance
    fp64_error: float | None = None  # rms distance from a float64 run of the reference (metric fp64)
    fp64_reference_error: float | None = None  # the reference's own
    fp64_scale: float | None = None  # rms of that float64 run
    dtype: str | None = None  # of both tensors; None when they differ (values then print as float64)
    first_index: list[int] | None = None
    first_actual: float | None = None
    first_expected: float | None = None
    first_ulp: int | None = None
    bad_rows: list[int] = field(default_factory=list)
    rows: int | None = None
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def judged_by(self, metric: Metric) -> None:
        """Pass or fail by `metric` instead of the element-wise tolerance (a shape or dtype problem
        still fails); the mismatching elements and rows stay those of the tolerance, for the report."""
        if self.problem or metric.name == "tolerance":  # the element-wise rule is the one `passed` follows
            return
        self.metric = str(metric)
        self.passed = metric.holds(asdict(self))

    def metric_value(self) -> str:
        """'nmse 3.2e-05 (bound 1e-06)' for the metric this comparison was judged by, or ''."""
        if self.metric is None or ":" not in self.metric:
            return ""
        name, _, bound = self.metric.partition(":")
        value = {"ulp": self.max_ulp, "fp64": (self.fp64_error, self.fp64_reference_error)}.get(name,
                                                                                             getattr(self, name, None))
        if name == "fp64" and isinstance(value, tuple):
            return f"rms error vs float64 {value[0]:.3g}, the reference's {value[1]:.3g} (factor {bound})"
        return f"{name} {value:.3g} (bound {bound})" if isinstance(value, (int, float)) else ""

    def first_difference(self, sides: tuple[str, str] | None = None) -> str:
        """'first at [0, 5]: -0.68649167 vs -0.6864917 (3 ulp; max 40 ulp)', actual vs expected, or ''
        with no mismatch. With `sides` (the names of the expected side and of the actual one) each
        value is named, the expected first: 'first at [0, 5]: A -0.6864917 vs B -0.68649167 (...)'."""
        if self.first_index is None or self.first_actual is None or self.first_expected is None:
            return ""
        actual, expected = format_value(self.first_actual, self.dtype), format_value(self.first_expected, self.dtype)
        text = (f"first at {self.first_index}: {actual} vs {expected}" if sides is None else
                f"first at {self.first_index}: {sides[0]} {expected} vs {sides[1]} {actual}")
        if self.first_ulp is not None:
            text += f" ({self.first_ulp} ulp; max {self.max_ulp} ulp)"
        return text


def format_value(value: float, dtype: str | None) -> str:
    """`value` with the digits that tell it from any other value of `dtype`: float32 as the shortest
    decimal that reads back as the same float32; float16 and bfloat16 exactly (their every digit);
    float64 as the shortest that reads back as the same float64; integers and booleans as integers."""
    if dtype == "float32":
        return str(np.float32(value))
    if dtype in ("float16", "bfloat16") and math.isfinite(value):
        return str(Decimal(value)).replace("E", "e")
    if dtype is not None and not dtype.startswith(("float", "bfloat")) and float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def dtype_name(dtype: torch.dtype) -> str:
    """'float32' for torch.float32."""
    return str(dtype).removeprefix("torch.")


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bits (NaNs with equal bits are equal)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(bit_pattern(a), bit_pattern(b))


def ulp_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor | None:
    """Element by element, how many representable values of their dtype lie between same-dtype
    floats a and b (units in the last place); None for other dtypes."""
    if a.dtype not in _ULP_DTYPES or a.dtype != b.dtype:
        return None

    def ordered(t: torch.Tensor) -> torch.Tensor:
        # Map float bits to integers that sort like the floats (negatives mirrored).
        bits = bit_pattern(t)
        i = bits.to(torch.int64)
        top = torch.iinfo(bits.dtype).min
        return torch.where(i < 0, top - i, i)

    if a.dtype == torch.float64:  # two 64-bit positions can be 2^64 apart: no wrap, exact below 2^53
        return (ordered(a).double() - ordered(b).double()).abs()
    return (ordered(a) - ordered(b)).abs()


def row_ranges(rows: list[int]) -> str:
    """[1,2,3,7] -> '1-3, 7'."""
    if not rows:
        return ""
    parts, start, prev = [], rows[0], rows[0]
    for r in rows[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(parts)


def compare(actual: torch.Tensor, expected: torch.Tensor, tolerance: Tolerance | None,
            batch_axis: int | None = None, *, same_dtype: bool = True) -> Comparison:
    """Compare within `tolerance` (None: bitwise). Rows are indices along `batch_axis`.

    With `same_dtype` False a dtype difference is allowed (a reference that computes
    in fp32 against a bf16 kernel); otherwise it fails the comparison.
    """
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    numel = expected.numel()
    if actual.shape != expected.shape:
        return Comparison(False, False, numel, mismatches=numel,
                          problem=f"shape {list(actual.shape)} != expected {list(expected.shape)}")
    equal = bitwise_equal(actual, expected)
    if equal:
        rows = expected.shape[batch_axis] if batch_axis is not None and expected.dim() else None
        return Comparison(True, True, numel, max_ulp=0 if expected.dtype in _ULP_DTYPES else None, rows=rows)
    a, e = actual.to(torch.float64), expected.to(torch.float64)
    bad = _disagreeing(actual, expected, tolerance)
    mismatches = int(bad.sum())
    dtype_ok = actual.dtype == expected.dtype or not same_dtype
    ulps = ulp_distances(actual, expected)
    measured = metrics.measure(actual, expected)
    comparison = Comparison(False, mismatches == 0 and dtype_ok, numel, mismatches=mismatches,
                            max_ulp=int(ulps.max()) if ulps is not None and numel else None,
                            dtype=dtype_name(actual.dtype) if actual.dtype == expected.dtype else None,
                            **measured)
    if not dtype_ok:
        comparison.problem = f"dtype {actual.dtype} != expected {expected.dtype}"
    if mismatches:
        first = tuple(int(i) for i in torch.nonzero(bad)[0]) if bad.dim() else ()
        comparison.first_index = list(first)
        comparison.first_actual = float(a[first])
        comparison.first_expected = float(e[first])
        nan_involved = bool(torch.isnan(a[first]) | torch.isnan(e[first]))  # NaN is no distance from anything
        comparison.first_ulp = int(ulps[first]) if ulps is not None and not nan_involved else None
    if batch_axis is not None and bad.dim() > batch_axis:
        comparison.rows = bad.shape[batch_axis]
        per_row = bad.movedim(batch_axis, 0).reshape(bad.shape[batch_axis], -1).any(dim=1)
        comparison.bad_rows = [int(r) for r in torch.nonzero(per_row).flatten()]
    return comparison


def agreement(actual: torch.Tensor, expected: torch.Tensor, tolerance: Tolerance | None) -> torch.Tensor | None:
    """Whether `compare(actual, expected, tolerance, same_dtype=False)` passes, as a 0-d bool
    tensor on the tensors' device, computed in stream order with nothing read back; None where
    the shapes or devices differ (compare says how, on the host). Compare's own element rule
    (_disagreeing), so a caller can read one flag for many outputs and run compare only on a
    failure."""
    if actual.shape != expected.shape or actual.device != expected.device:
        return None
    return ~_disagreeing(actual, expected, tolerance).any()


def _disagreeing(actual: torch.Tensor, expected: torch.Tensor, tolerance: Tolerance | None) -> torch.Tensor:
    """Element by element, where `actual` and `expected` (same shape) disagree: bits (tolerance
    None), exact integers, or for floats not close: equal values (infinities included) and two
    NaNs agree, anything else only by a finite difference within atol + rtol * |expected| (so an
    infinity matches only itself, and NaN arithmetic can only fail)."""
    if tolerance is None:
        return ~_elementwise_bits_equal(actual, expected)
    if not (actual.dtype.is_floating_point or expected.dtype.is_floating_point):
        return actual.to(torch.int64) != expected.to(torch.int64)  # integers compare exactly, not through float64
    return ~torch.isclose(actual.to(torch.float64), expected.to(torch.float64), rtol=tolerance.rtol,
                          atol=tolerance.atol, equal_nan=True)


def _elementwise_bits_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.dtype == b.dtype:
        return bit_pattern(a) == bit_pattern(b)
    return a == b

