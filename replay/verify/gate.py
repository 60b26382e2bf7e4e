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
not judge each other). A kind never seen before, after the first WARMUP calls of the op that the
gate read, is an outlier (a size seen once; counted in calls read, so that a gate reading a share
of calls does not take the kinds it has not met yet for new ones); floating-point contents far
from their kind's past are outliers (a spike, a NaN, a scale never seen).

How far is far. Per number, an exponentially weighted centroid and mean absolute deviation
(weight ALPHA, or plain means over a kind's first 1/ALPHA calls), updated once a batch from the
calls that were not outliers; a call's score is its largest deviation in those units. The
threshold is MARGIN times a running estimate of the QUANTILE-th quantile of past scores (the
stochastic-approximation steps of a batch's calls taken at once). A kind's first KIND_WARMUP
calls only teach it; an outlier does not move the centroid, so a run of bad inputs stays
flagged; nor does a call whose numbers are not all finite (a NaN, an infinity: scored, never
learnt, so a masked -inf in every call teaches a kind nothing rather than everything).
"""
from __future__ import annotations

import collections
import logging
import statistics
import threading
import time
from typing import Any, Callable, Iterable

import numpy as np
import torch

from replay.verify import call_stats
from replay.verify.call_stats import MAX_TENSORS, PROGRAMS, STAT_ELEMENTS, TYPE_CODES

log = logging.getLogger(__name__)

ALPHA = 0.02
QUANTILE = 0.99
MARGIN = 3.0
# calls of an op read before a kind never seen counts as an outlier: a kind made once in 70 calls (a
# prefill among decode steps) is met within 64 reads 60% of the time, within 256 97%
WARMUP = 256
KIND_WARMUP = 64  # calls of a kind that only teach its statistics
KINDS = 256  # kinds remembered per op; past that every kind starts again (KindGates.kind_id)
BATCH = 64  # calls whose statistics are computed together: the gate decides this many calls late at least
BATCHES = 16  # batches in flight at once; past that a batch goes unread ("unscored")
HELD_BYTES = 64 << 20  # a batch closes early rather than hold more of the program's memory than this
WIDTH = 3 * MAX_TENSORS  # numbers a call: three a tensor read, zeros where the kind reads fewer
NOT_FINITE = 1e30  # what a NaN or an infinity among a call's numbers becomes: far from anything
BUDGET = 0.02  # the share of the program's time the budgeted gates take together, at most (budgeted_share)
MIN_SHARE = 1 / 256  # the least share of calls a budgeted gate reads
MEASURED = 16  # gaps between reads a gate's rate is measured from, at least


class KindGates:
    """An op's gate. Each kind (an id given at the call, `kind_id`) has a row in arrays of
    centroids, spreads, quantile estimates and counts, so that a batch of calls of any kinds is
    scored with one set of array operations (their cost is per batch, not per kind)."""

    def __init__(self) -> None:
        self._ids: dict[tuple[Any, ...], int] = {}
        self._center = np.zeros((KINDS, WIDTH))
        self._spread = np.zeros((KINDS, WIDTH))
        self._q = np.zeros(KINDS)
        self._seen = np.zeros(KINDS, dtype=np.int64)

    def kind_id(self, kind: tuple[Any, ...]) -> tuple[int, bool]:
        """The row of `kind`, and whether it is new. Past KINDS kinds every kind starts again
        (learning anew is cheaper than remembering which to forget)."""
        known = self._ids.get(kind)
        if known is not None:
            return known, False
        if len(self._ids) >= KINDS:
            self._ids.clear()
            for state in (self._center, self._spread, self._q, self._seen):
                state.fill(0)
        row = self._ids[kind] = len(self._ids)
        return row, True

    def flag(self, ids: np.ndarray, x: np.ndarray) -> np.ndarray:
        """Which of a batch's calls (kind rows `ids`, features `x` [calls, WIDTH], in call order)
        are outliers; learns from the rest, once for the batch."""
        finite = (x < NOT_FINITE).all(axis=1)  # a NaN or an infinity is scored, never learnt
        places = np.flatnonzero(finite)
        kinds, first = np.unique(ids[places], return_index=True)
        starting = self._seen[kinds] == 0
        starters = np.zeros(len(ids), dtype=bool)
        starters[places[first[starting]]] = True  # a kind's first finite call sets its centroid
        self._center[kinds[starting]] = x[places[first[starting]]]
        self._seen[kinds[starting]] = 1
        center, q, seen = self._center[ids], self._q[ids], self._seen[ids]
        scores = (np.abs(x - center) / (self._spread[ids] + 1e-6 * (np.abs(center) + 1))).max(axis=1)
        flagged = ~starters & (seen >= KIND_WARMUP) & (scores > MARGIN * np.maximum(q, 1.0))
        learn = ~starters & ~flagged & finite & (seen > 0)
        k, which = np.unique(ids[learn], return_inverse=True)  # the kinds that learn, and each row's among them
        if not len(k):
            return flagged
        member = (which[:, None] == np.arange(len(k))[None, :]).astype(np.float64)  # [rows, kinds]
        m = member.sum(axis=0)
        sums = member.T @ np.concatenate((x[learn], np.abs(x[learn] - center[learn]),
                                          (scores[learn] > q[learn])[:, None]), axis=1)
        seen = self._seen[k]
        # plain means over a kind's first calls (a fair estimate from the start), then weight ALPHA a call
        weight = np.maximum(1.0 - (1.0 - ALPHA) ** m, m / (seen + m))[:, None]
        self._center[k] += weight * (sums[:, :WIDTH] / m[:, None] - self._center[k])
        self._spread[k] += weight * (sums[:, WIDTH:2 * WIDTH] / m[:, None] - self._spread[k])
        # Robbins-Monro, a batch's m steps at once: q moves up by QUANTILE for each score above it and
        # down by 1 - QUANTILE for each below, by steps of max(ALPHA, 1/n) for the n-th call of the kind
        above = sums[:, -1]
        steps = np.maximum(ALPHA * m, np.log((seen + m) / seen))
        self._q[k] = np.maximum(self._q[k] + np.maximum(self._q[k], 1.0) * steps
                                * (QUANTILE * above - (1 - QUANTILE) * (m - above)) / m, 0.0)
        self._seen[k] += m.astype(np.int64)
        return flagged


def budgeted_share(rates: Iterable[float], budget: float) -> float:
    """The share of calls each budgeted gate reads so that together they take about `budget` of
    the program's time: a gate reading a share s of calls takes s times its rate (StatsFeed.rate),
    and every budgeted gate reads the same share (never below MIN_SHARE)."""
    total = sum(rates)
    return 1.0 if total <= budget else max(budget / total, MIN_SHARE)


def features(partials: np.ndarray, numels: np.ndarray) -> np.ndarray:
    """[rows, 3]: mean |x|, rms and max |x| of each row's tensor, from its partials ([rows, 3,
    PROGRAMS]) and sizes; what is not finite (a NaN, an overflow) as NOT_FINITE."""
    sums = partials[:, :2].sum(axis=2, dtype=np.float64)
    numbers = np.stack((sums[:, 0] / numels, np.sqrt(np.maximum(sums[:, 1], 0.0) / numels),
                        partials[:, 2].max(axis=1)), axis=1)
    return np.where(np.isfinite(numbers), numbers, NOT_FINITE)


class StatsFeed:
    """One verified op's calls on their way to its gate, on the program's thread, never waiting for
    the device: `observe` notes a call's kind and the tensors to read; `close`, after the BATCH-th
    call has run, hands the batch to the device (one launch and an event) and scores the batches
    whose statistics are in. `on_flag(number)` is called for a call found unusual.

    It also measures what it costs: `rate` is the gate's seconds on the program's thread a second
    of the program's own, were every call of the op read (budgeted_share). It is the gate's time
    a call read (noting it, and closing batches) over the program's own time a call of the op:
    the median of the gaps between the calls read, the gate's time in each left out, each over
    the calls it spans (a median, so that the program's idle spells do not count as its work).
    Measured as batches close, from MEASURED gaps or more, the first batch left out (_measure)."""

    def __init__(self, on_flag: Callable[[int], None], count: Callable[[str, int], None]) -> None:
        self.on_flag, self.count = on_flag, count
        self.gates = KindGates()
        self._lock = threading.Lock()
        self._device: int | None = None  # where the tensors read live (a CUDA device, -1 the host): see _adopt
        # [BATCHES, rows, 3] int64 and [BATCHES, rows, 3, PROGRAMS] float32 (call_stats); pinned for a GPU
        self._tables: Any = None
        self._partials: Any = None
        self._free = list(range(BATCHES))  # batch buffers not in flight
        self._pending: collections.deque[tuple[int, list[tuple[int, int, int]], list[torch.Tensor], Any]] = \
            collections.deque()
        self._calls: list[tuple[int, int, int]] = []  # the open batch: (number, kind row, tensors read)
        self._tensors: list[torch.Tensor] = []  # its tensors to read, held until they are
        self._rows: list[tuple[int, int, int]] = []  # address, count, type code a tensor
        self._held = 0
        self._read = 0  # calls noted: the op's warm-up is counted in these (WARMUP)
        self._failed = False  # the gate's failure was said (_failure)
        self.rate = 0.0  # measured at each close but the first: see the class's docstring
        self._set_up = False  # a batch has closed: the gate's one-time costs are paid
        self._spent = 0.0  # the gate's seconds (noting, closing) since `rate` was measured
        self._reads = 0  # the calls read in the batches closed since then
        self._last_read: tuple[float, int] | None = None  # when the last call read was noted, and its number
        self._since_read = 0.0  # the gate's seconds since then (noting it, closing batches)
        self._gaps: list[float] = []  # the program's seconds a call of the op, between the calls read

    def observe(self, number: int, args: tuple, kwargs: dict) -> bool:
        """Note one call, before it runs; True when its batch is full, to be closed (`close`)
        once the call has run. The gate never breaks a call: what fails here is logged once and
        the call goes unnoted."""
        started = time.perf_counter()
        try:
            return self._observe(number, args, kwargs, started)
        except Exception as exc:  # an argument nothing here foresaw
            self._failure(exc)
            return False
        finally:  # two threads may add at once: one addition lost only blurs the estimate
            spent = time.perf_counter() - started
            self._spent += spent
            self._since_read += spent

    def _failure(self, exc: Exception) -> None:
        """Say once that the gate failed; the program goes on (the calls concerned go unscored)."""
        if not self._failed:
            self._failed = True
            log.warning(f"replay.verify: the outlier gate failed: {type(exc).__name__}: {exc}; the program goes on")

    def _observe(self, number: int, args: tuple, kwargs: dict, started: float) -> bool:
        kind: list[Any] = []
        read: list[tuple[int, int, int]] = []  # address, count, type code of each tensor read
        held: list[torch.Tensor] = []
        size = 0
        device = self._device
        for value in (*args, *kwargs.values()) if kwargs else args:
            if isinstance(value, torch.Tensor):
                dtype, n = value.dtype, value.numel()
                code = TYPE_CODES.get(dtype)
                watched = (code is not None and len(read) < MAX_TENSORS and 0 < n <= STAT_ELEMENTS
                           and value.is_contiguous()
                           and value.get_device() == (device if device is not None else self._adopt(value)))
                kind.append((dtype, n.bit_length(), watched))
                if watched:
                    read.append((value.data_ptr(), n, code or 0))
                    held.append(value)
                    size += n * value.element_size()
        with self._lock:
            self._tensors += held
            self._rows += read
            self._held += size
            row, new = self.gates.kind_id(tuple(kind))
            self._calls.append((number, row, len(read)))
            self._read += 1
            last = self._last_read
            if last is not None and number > last[1]:  # the program's own time since, the gate's left out
                self._gaps.append((started - last[0] - self._since_read) / (number - last[1]))
            self._last_read, self._since_read = (started, number), 0.0
            due = len(self._calls) >= BATCH or self._held > HELD_BYTES
            warm = self._read > WARMUP
        if new and warm:  # a kind never seen, after the op's warm-up: known now, no device needed
            self.count("flagged", 1)
            self.on_flag(number)
        return due

    def close(self) -> None:
        """Close the open batch (its last call has run): its statistics go to the device, and the
        batches whose statistics are in are scored."""
        started = time.perf_counter()
        try:
            with self._lock:
                reads = len(self._calls)
                self._close()
                self._score(wait=False)
                self._measure(reads, time.perf_counter() - started)
        except Exception as exc:  # the gate's failure is never the program's
            self._failure(exc)

    def _measure(self, reads: int, closing: float) -> None:
        """The gate's `rate` from the batches closed since it was last measured: `reads` calls
        noted in the one just closed, then `closing` seconds of closing it. Measured once MEASURED
        gaps are in (batches a drain cut short add up), but for the first batch, which made the
        buffers and compiled the kernel: costs paid once."""
        self._since_read += closing
        self._spent += closing
        self._reads += reads
        if reads and not self._set_up:
            self._set_up = True
            self._gaps, self._spent, self._reads = [], 0.0, 0
            return
        if len(self._gaps) < MEASURED:
            return
        gap = statistics.median(self._gaps)
        if gap > 0 and self._reads:
            self.rate = self._spent / self._reads / gap
        self._gaps, self._spent, self._reads = [], 0.0, 0

    def _adopt(self, tensor: torch.Tensor) -> int:
        """The first tensor to read decides where the gate reads (its CUDA device, or the host):
        the buffers are made for it."""
        device = tensor.get_device()
        with self._lock:
            if self._device is None:
                self._tables, self._partials = call_stats.buffers(BATCHES, BATCH * MAX_TENSORS, device >= 0)
                self._device = device
            return self._device

    def flush(self) -> None:
        """Close the open batch, however few calls it holds, and score every batch (a drain: this
        waits for the device)."""
        started = time.perf_counter()
        try:
            with self._lock:
                reads = len(self._calls)
                self._close()
                waited = self._score(wait=True)
                # a program that drains often closes its batches here: measured as a close is, its
                # wait for the device left out, and each read charged its part of a full batch's
                # closing (a close costs the same however few calls it holds: charged whole to a
                # few reads, it would lower the share, and the next batches would be smaller still)
                self._measure(reads, (time.perf_counter() - started - waited) * min(reads, BATCH) / BATCH)
        except Exception as exc:
            self._failure(exc)

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
            table.numpy()[:len(tensors)] = rows
            if self._device is not None and self._device >= 0:
                with torch.cuda.device(self._device):  # its current stream: where the program works on them
                    call_stats.launch(table, partials, len(tensors))
                    landed = torch.cuda.Event()
                    landed.record()
            else:
                call_stats.on_host(tensors, partials)
        self._pending.append((batch, calls, tensors, landed))

    def _score(self, wait: bool) -> float:
        """Score the closed batches whose statistics are in, oldest first, all at once (under the
        lock). Without `wait` a batch still on the device stops the walk: it is scored at a later
        close; nothing here waits for the device then. Returns the seconds it waited."""
        ready, waited = [], 0.0
        while self._pending:
            landed = self._pending[0][3]
            if landed is not None and not landed.query():
                if not wait:
                    break
                started = time.perf_counter()
                landed.synchronize()
                waited += time.perf_counter() - started
            ready.append(self._pending.popleft())
        if not ready:
            return waited
        calls: list[tuple[int, int, int]] = []
        partials, sizes = [np.zeros((0, 3, PROGRAMS), dtype=np.float32)], [np.zeros(0, dtype=np.int64)]
        try:
            for batch, its_calls, tensors, _ in ready:
                if tensors:  # a batch of calls that read none has no statistics (nor, maybe, buffers)
                    partials.append(self._partials[batch, :len(tensors)].numpy())
                    sizes.append(self._tables[batch, :len(tensors), 1].numpy())
                calls += its_calls
        finally:  # read (or failed to be): their buffers and the program's memory are free again
            self._free += (batch for batch, *_ in ready)
            for _, _, tensors, _ in ready:
                tensors.clear()
        numbers = features(np.concatenate(partials), np.concatenate(sizes))
        ids, counts = np.array(calls, dtype=np.int64)[:, 1:].T
        # each call's rows side by side, zeros past the tensors it read
        starts = np.cumsum(counts) - counts
        present = np.arange(MAX_TENSORS)[None, :] < counts[:, None]
        laid = np.zeros((len(calls), MAX_TENSORS, 3))
        laid[present] = numbers[(starts[:, None] + np.arange(MAX_TENSORS)[None, :])[present]]
        x = laid.reshape(len(calls), WIDTH)
        for place in np.flatnonzero(self.gates.flag(ids, x)):
            self.count("flagged", 1)
            self.on_flag(calls[place][0])
        return waited
