"""q4k_gemv and q6k_gemv: out [M, N] = x [M, K] @ dequant(weight).T for ggml k-quant weights.

    q4k_gemv(x [M, K], weight)  W in Q4_K super-blocks (144 bytes / 256 weights)
    q6k_gemv(x [M, K], weight)  W in Q6_K super-blocks (210 bytes / 256 weights)

Both ops run one kernel (launched by kernels/kquant/matmul.py): one x row a program for the single
variant, up to BATCHED_BLOCK_M for the batched one, with each x row's sums the same chain
of operations either way (docs/KERNELS.md: "Determinism and row invariance").
"""
from __future__ import annotations

import torch

import replay
from replay_kernels.ggml_quant import Q4_K, Q6_K, QuantFormat
from replay_kernels.kquant.matmul import BATCHED_BLOCK_M, dequant_matmul_reference, kquant_matmul
from replay.tolerance import REDUCTION


def _declare(name: str, fmt: QuantFormat) -> replay.Op:
    """replay.Op `name` over weights in format `fmt`, with its reference, single and batched variants."""
    op = replay.op(
        name,
        batch_axes={"x": 0, "out": 0},
        tolerance=REDUCTION,
        doc=f"out = x @ dequant_{fmt.name}(weight).T; weight uint8 [N, K/256*{fmt.block_bytes}] "
            f"in ggml {fmt.name} layout; fp32 accumulation, output in x's dtype.",
        kernel_rules=replay.KernelRules(row_axis="y"),  # x rows on axis 1, weight rows on axis 0
    )

    def reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """ggml's dequantisation, then an fp32 matmul rounded once to x's dtype."""
        return dequant_matmul_reference(x, weight, fmt)

    def single(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """One x row (the decode step): one row a program."""
        return kquant_matmul(x, weight, fmt, block_m=1)

    def batched(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """M x rows, up to BATCHED_BLOCK_M a program sharing each weight load."""
        return kquant_matmul(x, weight, fmt, block_m=BATCHED_BLOCK_M)

    for fn in (reference, single, batched):
        fn.__name__ = fn.__qualname__ = f"{name}_{fn.__name__}"
    op.reference(reference)
    op.single(single)
    op.batched(batched)
    return op


q4k_gemv = _declare("q4k_gemv", Q4_K)
q6k_gemv = _declare("q6k_gemv", Q6_K)
