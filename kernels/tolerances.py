"""How far a kernel may land from its reference, per output dtype, and why.

A check passes where |kernel - reference| <= atol + rtol * |reference| element by element.
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

import torch

from replay import Tolerance

_HALF = {
    torch.float16: Tolerance(atol=1e-3, rtol=2e-3),
    torch.bfloat16: Tolerance(atol=1e-2, rtol=1.6e-2),
}

ELEMENTWISE: dict[torch.dtype, Tolerance] = {torch.float32: Tolerance(atol=1e-5, rtol=1e-4), **_HALF}
REDUCTION: dict[torch.dtype, Tolerance] = {torch.float32: Tolerance(atol=1e-4, rtol=1e-4), **_HALF}
EXACT: dict[torch.dtype, Tolerance] = {dt: Tolerance(0.0, 0.0)
                                       for dt in (torch.float32, torch.float16, torch.bfloat16)}

# The whole model (fp32 activations) against the all-reference model: per-op differences
# of a few fp32 ulps pass through 2 layers and the lm_head.
MODEL_LOGITS = Tolerance(atol=1e-3, rtol=1e-3)
