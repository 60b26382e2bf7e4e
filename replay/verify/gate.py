"""The outlier gate: which calls look unlike the calls before them, decided a batch of calls late
without ever waiting for the device; the calls after an unusual one are then checked whatever
the sampling rate says.

What the gate reads. Each call of a verified op has a *kind*: for every tensor argument its
element type, its size rounded to a power of two, and whether the gate reads its contents. Each
kind has its own statistics: the contents of up to MAX_TENSORS floating-point tensors of the
call (contiguous, at most STAT_ELEMENTS elements), as mean |x|, root mean square and max |x|.
They are computed for BATCH calls at a time, by one kernel on the tensors' device
(replay/verify/call_stats.py), and scored when a later batch closes, once an event says they
are in (asked, never waited for; a drain waits). The scoring runs on the thread that closes the
batch, the program's: on a thread of its own it cost the program more, in hand-overs of the
interpreter lock, than the scoring itself (docs/PERFORMANCE.md). So they describe each tensor as it is when its batch closes, at most BATCH calls of the op
after its call ran: the batch holds the tensors, so their memory is not reused meanwhile, but a
tensor written in place since (by the call itself, or a buffer the program reuses) is read as it
is then. Either way the gate sees what the op is handed lately, which is what it decides on: the
calls after an unusual one are checked.

What varies by design is not scored: sizes and integer tensors and arguments (sequence lengths,
positions, page tables, batch sizes) are what a program changes from step to step, so they only
pick the kind, and each kind learns its own contents (a prefill's and a decode step's calls do
not judge each other). A kind never seen before, after the op's first WARMUP calls, is an
outlier (a size seen once); floating-point contents far from their kind's past are outliers (a
spike, a NaN, a scale never seen).

How far is far. Per number, an exponentially weighted centroid and mean absolute deviation
(weight ALPHA, or plain means over a kind's first 1/ALPHA calls), updated once a batch from the
calls that were not outliers; a call's score is its largest deviation in those units. The
threshold is MARGIN times a running estimate of the QUANTILE-th quantile of past scores (a
stochastic-approximation step per call). A kind's first KIND_WARMUP calls only teach it; an
outlier does not move the centroid, so a run of bad inputs stays flagged.
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Callable

import numpy as np
import torch

from replay.verify import call_stats
from replay.verify.call_stats import MAX_TENSORS, PROGRAMS, STAT_ELEMENTS, TYPE_CODES

ALPHA = 0.02
QUANTILE = 0.99
MARGIN = 3.0
WARMUP = 64  # calls of an op before a kind never seen counts as an outlier
KIND_WARMUP = 64  # calls of a kind that only teach its statistics
KINDS = 256  # kinds remembered per op; past that the oldest is forgotten (and flagged if it comes back)
BATCH = 32  # calls whose statistics are computed together: the gate decides this many calls late at least
BATCHES = 16  # batches in flight at once; past that a batch goes unread ("unscored")
HELD_BYTES = 64 << 20  # a batch closes early rather than hold more of the program's memory than this


class OutlierGate:
    """flag(X) -> which rows of features X ([calls, features], one kind, in call order) are
    outliers; learns from the rest."""

    def __init__(self, width: int, warmup: int = KIND_WARMUP) -> None:
        self.warmup = warmup
        self.seen = 0
        self._center = np.zeros(width)
        self._spread = np.zeros(width)
        self._q = 0.0

    def flag(self, x: np.ndarray) -> np.ndarray:
        first = self.seen == 0
        if first:
            self._center = x[0].copy()
            self.seen = 1
        rest = x[1:] if first else x
        flagged = np.zeros(len(rest), dtype=bool)
        if len(rest):
            scale = self._spread + 1e-6 * (np.abs(self._center) + 1)
            scores = (np.abs(rest - self._center) / scale).max(axis=1, initial=0.0)
            if self.seen >= self.warmup:
                flagged = scores > MARGIN * max(self._q, 1.0)
            self._learn(rest[~flagged], scores[~flagged])
        return np.concatenate(([False], flagged)) if first else flagged

    def _learn(self, x: np.ndarray, scores: np.ndarray) -> None:
        m = len(x)
        if not m:
            return
        # plain means over the first calls (a fair estimate from the start), then weight ALPHA a call
        weight = max(1.0 - (1.0 - ALPHA) ** m, m / (self.seen + m))
        deviation = np.abs(x - self._center).mean(axis=0)
        self._center += weight * (x.mean(axis=0) - self._center)
        self._spread += weight * (deviation - self._spread)
        # Robbins-Monro: q moves up by QUANTILE for each score above it, down by 1 - QUANTILE for each below
        above = int((scores > self._q).sum())
        step = max(self._q, 1.0) * max(ALPHA, 1.0 / (self.seen + m))
        self._q = max(self._q + step * (QUANTILE * above - (1 - QUANTILE) * (m - above)), 0.0)
        self.seen += m


class KindGates:
    """An op's gate: one OutlierGate a kind, and the kinds seen."""

    def __init__(self) -> None:
        self.calls = 0
        self._kinds: dict[tuple[Any, ...], OutlierGate] = {}

    def flag(self, calls: list[tuple[int, tuple[Any, ...], int]], numbers: np.ndarray) -> list[int]:
        """The numbers of a batch's calls ((number, kind, tensors read), in call order) that are
        outliers, given the feature rows of their tensors read ([rows, 3], in the same order)."""
        flagged: list[int] = []
        by_kind: dict[tuple[Any, ...], tuple[list[int], list[int]]] = {}  # its calls' places, their first rows
        row = 0
        for i, (_, kind, count) in enumerate(calls):
            places, starts = by_kind.setdefault(kind, ([], []))
            places.append(i)
            starts.append(row)
            row += count
        for kind, (places, starts) in by_kind.items():
            count = calls[places[0]][2]
            x = numbers[np.add.outer(np.asarray(starts), np.arange(count))].reshape(len(starts), 3 * count)
            gate = self._kinds.get(kind)
            if gate is None:
                if len(self._kinds) >= KINDS:
                    del self._kinds[next(iter(self._kinds))]
                gate = self._kinds[kind] = OutlierGate(3 * count)
                if self.calls + places[0] >= WARMUP:  # a kind never seen, after the op's warm-up
                    flagged.append(calls[places[0]][0])
            flagged += (calls[places[j]][0] for j in np.flatnonzero(gate.flag(x)))
        self.calls += len(calls)
        return sorted(flagged)

def features(partials: np.ndarray, numels: np.ndarray) -> np.ndarray:
    """[rows, 3]: mean |x|, rms and max |x| of each row's tensor, from its partials ([rows,
    PROGRAMS, 3]) and sizes; what is not finite (a NaN, an overflow) as 1e30, far from anything."""
    sums = partials[:, :, :2].astype(np.float64).sum(axis=1)
    numbers = np.stack((sums[:, 0] / numels, np.sqrt(np.maximum(sums[:, 1], 0.0) / numels),
                        partials[:, :, 2].max(axis=1)), axis=1)
    return np.where(np.isfinite(numbers), numbers, 1e30)


class StatsFeed:
    """One verified op's calls on their way to its gate. `observe` runs on the program's thread
    and never waits for the device: it notes the call's kind and the tensors to read, and every
    BATCH calls hands the batch to the device (one launch and an event) and scores the batches
    whose statistics are in. `on_flag(number)` is called for a call found unusual."""

    def __init__(self, on_flag: Callable[[int], None], count: Callable[[str, int], None]) -> None:
        self.on_flag, self.count = on_flag, count
        self.gates = KindGates()
        self._lock = threading.Lock()
        self._device: int | None = None  # where the tensors read live (a CUDA device, -1 the host): see _adopt
        # [BATCHES, rows, 3] int64 and [BATCHES, rows, PROGRAMS, 3] float32 (call_stats); pinned for a GPU
        self._tables: Any = None
        self._partials: Any = None
        self._free = list(range(BATCHES))  # batch buffers not in flight
        self._pending: collections.deque[tuple[int, list[Any], list[torch.Tensor], Any]] = collections.deque()
        self._calls: list[tuple[int, tuple[Any, ...], int]] = []  # the open batch: (number, kind, rows read)
        self._tensors: list[torch.Tensor] = []  # its tensors to read, held until they are
        self._rows: list[int] = []  # address, count, type code a tensor
        self._held = 0

    def observe(self, number: int, args: tuple, kwargs: dict) -> None:
        """Note one call, before it runs."""
        kind: list[Any] = []
        read: list[torch.Tensor] = []
        for value in (*args, *kwargs.values()) if kwargs else args:
            if isinstance(value, torch.Tensor):
                n = value.numel()
                watched = False
                if (len(read) < MAX_TENSORS and value.dtype in TYPE_CODES and 0 < n <= STAT_ELEMENTS
                        and value.is_contiguous()):
                    where = value.get_device()
                    watched = where == (self._device if self._device is not None else self._adopt(where))
                kind += (value.dtype, n.bit_length(), watched)
                if watched:
                    read.append(value)
        with self._lock:
            for tensor in read:
                self._tensors.append(tensor)
                self._rows += (tensor.data_ptr(), tensor.numel(), TYPE_CODES[tensor.dtype])
                self._held += tensor.numel() * tensor.element_size()
            self._calls.append((number, tuple(kind), len(read)))
            if len(self._calls) == BATCH or self._held > HELD_BYTES:
                self._close()

    def _adopt(self, device: int) -> int:
        """The first tensor to read decides where the gate reads (its CUDA device, or the host):
        the buffers are made for it."""
        with self._lock:
            if self._device is None:
                self._tables, self._partials = call_stats.buffers(BATCHES, BATCH * MAX_TENSORS, device >= 0)
                self._device = device
            return self._device

    def flush(self) -> None:
        """Close the open batch, however few calls it holds, and score every batch (a drain: this
        waits for the device)."""
        with self._lock:
            self._close()
            self._score(wait=True)

    def _close(self) -> None:
        calls, tensors, rows = self._calls, self._tensors, self._rows
        self._calls, self._tensors, self._rows, self._held = [], [], [], 0
        if not calls:
            return
        if not self._free:  # every buffer still on the device: these calls go unread
            self.count("unscored", len(calls))
            return
        batch = self._free.pop()
        landed = None
        if tensors:
            table, partials = self._tables[batch], self._partials[batch]
            table.numpy()[:len(tensors)] = np.asarray(rows, dtype=np.int64).reshape(-1, 3)
            if self._device is not None and self._device >= 0:
                with torch.cuda.device(self._device):  # its current stream: where the program works on them
                    call_stats.launch(table, partials, len(tensors))
                    landed = torch.cuda.Event()
                    landed.record()
            else:
                call_stats.on_host(tensors, partials)
        self._pending.append((batch, calls, tensors, landed))
        self._score(wait=False)

    def _score(self, wait: bool) -> None:
        """Score the closed batches whose statistics are in, oldest first, all at once (under the
        lock). Without `wait` a batch still on the device stops the walk: it is scored at a later
        close; nothing here waits for the device then."""
        ready = []
        while self._pending:
            landed = self._pending[0][3]
            if landed is not None and not landed.query():
                if not wait:
                    break
                landed.synchronize()
            ready.append(self._pending.popleft())
        if not ready:
            return
        calls: list[tuple[int, tuple[Any, ...], int]] = []
        partials, sizes = [np.zeros((0, PROGRAMS, 3), dtype=np.float32)], [np.zeros(0, dtype=np.int64)]
        for batch, its_calls, tensors, _ in ready:
            rows = len(tensors)
            partials.append(self._partials[batch, :rows].numpy())
            sizes.append(self._tables[batch, :rows, 1].numpy())
            calls += its_calls
        numbers = features(np.concatenate(partials), np.concatenate(sizes))
        self._free += (batch for batch, *_ in ready)  # read: their buffers and the program's memory are free
        for number in self.gates.flag(calls, numbers):
            self.count("flagged", 1)
            self.on_flag(number)
