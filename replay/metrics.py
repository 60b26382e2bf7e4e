"""Error metrics beside the element-wise tolerance, and the rule each gives a pass by.

By default a comparison passes when every element is within the op's tolerance (replay.tolerance).
Numerical work often judges whole tensors instead; `--metric NAME:BOUND` (on `replay run`,
`replay diff` and `replay.verify`) or `replay.op(metric=...)` picks one of:

    bitwise          the same bits
    ulp:N            at most N units in the last place apart, element by element
    max_abs:T        max |a - e| <= T
    max_rel:T        max |a - e| / |e| <= T (finite elements)
    nmse:T           sum (a - e)^2 / sum e^2 <= T
    rel_diff:T       1 - 2 sum(a e) / (sum a^2 + sum e^2) <= T   (0 when equal, 1 when orthogonal)
    cosine:C         cosine similarity >= C
    beyond:T         the share of elements more than one thousandth off (|a - e| > 1e-3 |e|, or
                     > 1e-3 where e is 0) <= T
    fp64:F           no further from a float64 run of the reference than the reference itself
                     is, by a factor F (PyTorch's accuracy minifier's rule): rms(a - t) <= F rms(r - t)

All are computed in float64 over the finite elements; a NaN or infinity where the oracle has
none fails every metric but bitwise equality.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

BEYOND = 1e-3  # "one thousandth": msprobe's and Ascend's share-of-elements metric
NAMES = ("tolerance", "bitwise", "ulp", "max_abs", "max_rel", "nmse", "rel_diff", "cosine", "beyond", "fp64")
_BOUNDED = NAMES[2:]


@dataclass(frozen=True)
class Metric:
    """A metric and its bound: `nmse:1e-6`."""

    name: str
    bound: float = 0.0

    def __str__(self) -> str:
        return self.name if self.name not in _BOUNDED else f"{self.name}:{self.bound:g}"

    @property
    def needs_float64_run(self) -> bool:
        return self.name == "fp64"

    def holds(self, values: dict[str, Any]) -> bool:
        """Whether measured `values` (measure()'s, plus 'fp64'/'fp64_reference' errors for fp64) pass."""
        if values.get("bitwise_equal"):
            return True
        if self.name in ("bitwise", "tolerance"):
            return False  # the tolerance rule is compare's own; here only when bits differ
        if not values.get("finite_agree", True):
            return False
        if self.name == "cosine":
            return values["cosine"] >= self.bound
        if self.name == "fp64":
            mine, reference = values.get("fp64_error"), values.get("fp64_reference_error")
            if mine is None or reference is None:
                return False
            return mine <= self.bound * reference or mine <= 1e-12 * max(values.get("fp64_scale", 0.0), 1e-300)
        if self.name == "ulp":
            return values.get("max_ulp") is not None and values["max_ulp"] <= self.bound
        return values[self.name] <= self.bound


def parse(text: str) -> Metric:
    """'nmse:1e-6' as a Metric; ValueError naming what is wrong."""
    name, _, bound = text.partition(":")
    if name not in NAMES:
        raise ValueError(f"unknown metric {name!r}; one of {', '.join(NAMES)}")
    if name not in _BOUNDED:
        if bound:
            raise ValueError(f"metric {name!r} takes no bound")
        return Metric(name)
    try:
        value = float(bound)
    except ValueError:
        raise ValueError(f"metric {name!r} needs a bound: {name}:NUMBER") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"metric {name!r}: the bound must be a finite number >= 0, got {bound!r}")
    return Metric(name, value)


def measure_on_device(actual: torch.Tensor, expected: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every metric's value for same-shaped tensors (any dtypes), as 0-d float64 tensors (a bool
    for finite_agree) where the tensors are, computed in stream order with nothing read back."""
    a, e = actual.detach().to(torch.float64).flatten(), expected.detach().to(torch.float64).flatten()
    fa, fe = torch.isfinite(a), torch.isfinite(e)
    finite = fa & fe
    finite_agree = ((fa == fe) & (finite | (a == e) | (a.isnan() & e.isnan()))).all()
    zero = torch.zeros((), dtype=torch.float64, device=a.device)
    a, e = torch.where(finite, a, zero), torch.where(finite, e, zero)  # the others count as equal zeros
    diff = (a - e).abs()
    sq_e, sq_a, cross, err = (e * e).sum(), (a * a).sum(), (a * e).sum(), (diff * diff).sum()
    norms = (sq_a * sq_e).sqrt()
    cosine = torch.where(norms > 0, cross / norms.clamp_min(1e-300), (sq_a == sq_e).to(torch.float64))
    off = diff > BEYOND * torch.where(e == 0, torch.ones_like(e), e.abs())
    return {
        "finite_agree": finite_agree,
        "max_abs": diff.max() if diff.numel() else zero,
        "max_rel": (diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny)).max() if diff.numel() else zero,
        "nmse": torch.where(sq_e > 0, err / sq_e.clamp_min(1e-300), (err > 0).to(torch.float64)),
        "rel_diff": torch.where(sq_a + sq_e > 0, 1.0 - 2.0 * cross / (sq_a + sq_e).clamp_min(1e-300), zero),
        "cosine": cosine,
        "beyond": off.to(torch.float64).sum() / max(off.numel(), 1),
    }


def measure(actual: torch.Tensor, expected: torch.Tensor) -> dict[str, Any]:
    """measure_on_device's values read back: floats, and finite_agree a bool."""
    return {name: bool(v) if v.dtype == torch.bool else float(v)
            for name, v in measure_on_device(actual, expected).items()}


ON_DEVICE = ("bitwise", "max_abs", "max_rel", "nmse", "rel_diff", "cosine", "beyond")


def holds_on_device(metric: Metric, actual: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Whether `metric` holds, as a 0-d bool tensor on the tensors' device (nothing read back); the
    metrics of ON_DEVICE only (ulp and fp64 need more than the two tensors)."""
    if metric.name not in ON_DEVICE:
        raise ValueError(f"metric {metric.name!r} cannot be decided on the device; one of {', '.join(ON_DEVICE)}")
    if metric.name == "bitwise":
        same = actual.dtype == expected.dtype
        bits = (actual.reshape(-1).view(torch.uint8) == expected.reshape(-1).view(torch.uint8)).all() if same \
            else torch.zeros((), dtype=torch.bool, device=actual.device)
        return bits
    values = measure_on_device(actual, expected)
    value = values[metric.name]
    within = value >= metric.bound if metric.name == "cosine" else value <= metric.bound
    return values["finite_agree"] & within


def rms_error(actual: torch.Tensor, truth: torch.Tensor) -> float:
    """Root mean square of actual - truth over the finite elements of both (float64)."""
    a, t = actual.detach().to(torch.float64).flatten(), truth.detach().to(torch.float64).flatten()
    ok = torch.isfinite(a) & torch.isfinite(t)
    return math.sqrt(float(((a[ok] - t[ok]) ** 2).mean())) if bool(ok.any()) else 0.0
