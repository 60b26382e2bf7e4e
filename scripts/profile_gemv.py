"""One M=1 call of each GEMV at the bandwidth-target shapes, for a profiler to read.

On the GPU machine, from the repository root (docs/PERFORMANCE.md has the readings):

    python3 scripts/profile_gemv.py     # compile first, so the profiled run only launches
    PYTHONPATH=. ncu --clock-control none --kernel-name regex:kquant --launch-count 4 \\
        --section SpeedOfLight --section WarpStateStats --section Occupancy \\
        --section SchedulerStats --section LaunchStats python3 scripts/profile_gemv.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from replay_kernels.ggml_quant import Q4_K, Q6_K  # noqa: E402
from replay_kernels.kquant.matmul import kquant_matmul  # noqa: E402
from scripts.bench_kernels import GEMV_SHAPES, random_blocks  # noqa: E402


def main() -> None:
    for fmt in (Q4_K, Q6_K):
        for n, k in GEMV_SHAPES[:2]:
            x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
            kquant_matmul(x, random_blocks(fmt, n, k), fmt, block_m=1)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
