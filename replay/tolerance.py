"""How far a variant may land from its oracle, per output dtype, and why: the one home of tolerances.

A check passes where |actual - expected| <= atol + rtol * |expected|, element by element. No
tolerance at all (None where a tolerance is expected) means bitwise: the same bits, NaN
payloads and the sign of zero included.

Kernels accumulate in fp32; references compute in fp64 (or fp32 for the GEMVs, as ggml does)
and round once to the output dtype. Two effects separate them:

- the final rounding to the output dtype can fall on the other side of a tie: one ulp,
  2^-10 relative for fp16 and 2^-7 for bf16; rtol allows two ulps;
- fp32 arithmetic (summation order, exp, rsqrt) differs from the reference's by a few fp32
  ulps of the largest partial sum: rtol 1e-4 plus an atol for results that cancel to near 0.

Reductions over long rows (GEMV over K, attention over keys) get a larger fp32 atol because
their rounding error scales with sum|terms|, not with the (possibly cancelled) result.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tolerance:
    """An absolute and a relative bound on |actual - expected|: finite and not negative."""

    atol: float
    rtol: float

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


# Equal values (0.0 == -0.0; a NaN never passes): ops that move bits rather than compute them.
EXACT = Tolerance(0.0, 0.0)

_HALF = {
    torch.float16: Tolerance(atol=1e-3, rtol=2e-3),
    torch.bfloat16: Tolerance(atol=1e-2, rtol=1.6e-2),
}

# What an op declared without a tolerance gets; dtypes not listed (integers) compare EXACT.
DEFAULT: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(1e-9, 1e-9),
    torch.float32: Tolerance(1e-5, 1e-4),
    torch.float16: Tolerance(2e-3, 2e-3),
    torch.bfloat16: Tolerance(1.6e-2, 1.6e-2),
}
ELEMENTWISE: dict[torch.dtype, Tolerance] = {torch.float32: Tolerance(atol=1e-5, rtol=1e-4), **_HALF}
REDUCTION: dict[torch.dtype, Tolerance] = {torch.float32: Tolerance(atol=1e-4, rtol=1e-4), **_HALF}
