"""Declares a GEMV op over one ggml k-quant format; q4k_gemv and q6k_gemv are two of these."""
from __future__ import annotations

from typing import NamedTuple

import torch

import replay
from kernels import bugs, launch
from kernels.ggml_quant import QuantFormat
from kernels.kquant_matmul import BATCHED_BLOCK_M, dequant_matmul_reference, kquant_matmul
from kernels.tolerances import REDUCTION
from replay.registry import Op, Variant


class OpVariants(NamedTuple):
    op: Op
    reference: Variant
    single: Variant
    batched: Variant


def declare_kquant_gemv(name: str, fmt: QuantFormat, provider: str, planted_bug: str | None = None) -> OpVariants:
    """Op `name`: out [M, N] = x [M, K] @ dequant(weight [N, K/256*block_bytes]).T in x's dtype.

    `planted_bug`, when switched on (kernels.bugs), reaches the batched variant only.
    """
    op = replay.op(
        name,
        batch_axes={"x": 0, "out": 0},
        tolerance=REDUCTION,
        provider=provider,
        doc=f"out = x @ dequant_{fmt.name}(weight).T; weight uint8 [N, K/256*{fmt.block_bytes}] "
            f"in ggml {fmt.name} layout; fp32 accumulation, output in x's dtype.",
    )

    def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return dequant_matmul_reference(x, weight, fmt)

    def single(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        launch.check_one_row(name, x.shape[0])
        return kquant_matmul(x, weight, fmt, block_m=1)

    def batched(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        wrong_scale = planted_bug is not None and bugs.planted(planted_bug)
        return kquant_matmul(x, weight, fmt, block_m=BATCHED_BLOCK_M, wrong_scale=wrong_scale)

    for fn in (reference, single, batched):
        fn.__name__ = fn.__qualname__ = f"{name}_{fn.__name__}"
        fn.__module__ = provider
    return OpVariants(op, op.reference(reference), op.single(single), op.batched(batched))
