"""Which GPU each parallel probe gets, so K probes on K GPUs do not share one."""
from __future__ import annotations

import os


def visible_gpus(jobs: int) -> list[str]:
    """The GPU ids probes may use: CUDA_VISIBLE_DEVICES if set, else torch's count.

    torch is only asked when probes run in parallel (its import is slow), and a
    machine without torch or CUDA simply has none.
    """
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    if jobs < 2:
        return []
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # no torch, or a broken CUDA install: probes run without pinning
        return []


def device_for(slot: int, gpus: list[str]) -> str | None:
    """The CUDA_VISIBLE_DEVICES of the probe in `slot` of a round; None leaves it alone."""
    return gpus[slot % len(gpus)] if len(gpus) > 1 else None
