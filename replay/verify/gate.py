"""The outlier gate: which calls look unlike the calls before them, and get checked whatever the
sampling rate says.

Each call is described by a few cheap numbers: for every tensor argument log2(numel + 1) and,
for one of at most STAT_ELEMENTS elements, its mean absolute value, root mean square and
absolute maximum;
every int, float or bool argument as itself. The gate keeps, per number, an exponentially
weighted centroid and mean absolute deviation (weight ALPHA), and scores a call by its largest
deviation in those units. The threshold is MARGIN times a running estimate of the QUANTILE-th
quantile of past scores (a stochastic-approximation step per call). During the first WARMUP
calls it only learns; an outlier does not move the centroid, so a run of bad inputs stays
flagged. A call whose arguments change in kind (another tensor count) is an outlier too.
"""
from __future__ import annotations

import math
import threading
from typing import Any, Iterable

import torch

STAT_ELEMENTS = 1 << 20  # larger tensors (weights) contribute their size only: reading them costs too much
ALPHA = 0.02
QUANTILE = 0.99
MARGIN = 3.0
WARMUP = 64


def features(values: Iterable[Any]) -> list[float]:
    """The numbers the gate sees for one call's arguments: per tensor its size and, up to
    STAT_ELEMENTS elements, mean |x|, root mean square and max |x| (three norms each, read back
    in one transfer, and one wait, per device)."""
    out: list[float] = []
    norms: dict[torch.device, list[torch.Tensor]] = {}
    sizes: dict[torch.device, list[float]] = {}
    for value in values:
        if isinstance(value, torch.Tensor):
            out.append(math.log2(value.numel() + 1))
            if 0 < value.numel() <= STAT_ELEMENTS and not value.dtype.is_complex:
                t = value.detach()
                t = t if t.is_floating_point() else t.float()
                norms.setdefault(t.device, []).extend(
                    torch.linalg.vector_norm(t, order, dtype=torch.float32) for order in (1, 2, math.inf))
                sizes.setdefault(t.device, []).append(float(t.numel()))
        elif isinstance(value, (bool, int, float)):
            out.append(float(value))
    for device, on_device in norms.items():
        numbers = torch.stack(on_device).cpu().view(-1, 3)
        n = torch.tensor(sizes[device]).unsqueeze(1)
        for value in (numbers / torch.cat([n, n.sqrt(), torch.ones_like(n)], dim=1)).flatten().tolist():
            out.append(value if math.isfinite(value) else 1e30)
    return out


class OutlierGate:
    """flag(x) -> whether call features `x` are an outlier; learns from every call that is not."""

    def __init__(self, warmup: int = WARMUP, alpha: float = ALPHA, quantile: float = QUANTILE,
                 margin: float = MARGIN):
        self.warmup, self.alpha, self.quantile, self.margin = warmup, alpha, quantile, margin
        self.seen = 0
        self._center: list[float] = []
        self._spread: list[float] = []
        self._q = 0.0
        self._lock = threading.Lock()

    def flag(self, x: list[float]) -> bool:
        with self._lock:
            if self.seen == 0 or (len(x) != len(self._center) and self.seen < self.warmup):
                self._center, self._spread, self._q = list(x), [0.0] * len(x), 0.0
                self.seen = 1
                return False
            if len(x) != len(self._center):
                return True  # arguments of another kind than every call so far
            score = max((abs(v - c) / (s + 1e-6 * (abs(c) + 1)) for v, c, s in zip(x, self._center, self._spread)),
                        default=0.0)
            outlier = self.seen >= self.warmup and score > self.margin * max(self._q, 1.0)
            if not outlier:
                self._learn(x, score)
            return outlier

    def _learn(self, x: list[float], score: float) -> None:
        a = self.alpha
        for i, v in enumerate(x):
            delta = v - self._center[i]
            self._center[i] += a * delta
            self._spread[i] += a * (abs(delta) - self._spread[i])
        # Robbins-Monro: q moves up by (quantile) when a score is above it, down by (1 - quantile) otherwise
        step = max(self._q, 1.0) * a
        self._q += step * (self.quantile if score > self._q else -(1 - self.quantile))
        self.seen += 1
