"""Planted-bug switches: deliberate, named defects that prove the parity checks can fail.

A bug is planted while its name is listed in the environment variable KERNELS_PLANTED_BUGS
(comma-separated), read at every call, so a test, a replay in another process or a demo can
switch it on without editing code. Only batched variants honour switches; single and
reference variants stay correct, so the defect shows as a batched-vs-single divergence.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

ENV = "KERNELS_PLANTED_BUGS"

KNOWN = {
    "q6k_scale_index": "batched q6k_gemv dequantises sub-block 15 of every super-block with scale 14",
    "kv_scatter_stale_position_buf": "batched kv_scatter reads position_buf even when positions are given",
}


def active() -> set[str]:
    names = {n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip()}
    unknown = names - KNOWN.keys()
    if unknown:
        raise ValueError(f"{ENV}: unknown planted bug(s) {sorted(unknown)}; known: {sorted(KNOWN)}")
    return names


def planted(name: str) -> bool:
    """Whether bug `name` is switched on now."""
    if name not in KNOWN:
        raise KeyError(f"no planted bug named {name!r}; known: {sorted(KNOWN)}")
    return name in active()


@contextlib.contextmanager
def planting(*names: str) -> Iterator[None]:
    """Switch the named bugs on inside the block (restores the previous setting)."""
    for name in names:
        if name not in KNOWN:
            raise KeyError(f"no planted bug named {name!r}; known: {sorted(KNOWN)}")
    before = os.environ.get(ENV)
    os.environ[ENV] = ",".join(sorted(active() | set(names)))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before
