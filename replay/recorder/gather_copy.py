"""The graph staging's one copy kernel: many runs of bytes copied in one launch, and, for a flight
recording on the device, into the slot of a device ring that a counter in device memory names.

Inside a CUDA graph every node costs the replay a launch: torch's multi-tensor copy of byte views
took 6.7 us for 0.2 MB on the H100 (three a replay of the tiny model), where the bytes need well
under a microsecond. Here a table row is one block of one copy: (source address, destination
address, bytes, ring address, ring slot stride); a program copies its row with 8-byte words where
every address and length allows, else bytes, to the destination (unless 0) and to
`ring + slot * stride` (unless the ring address is 0), where `slot` is the device counter modulo
the ring's slots. The launch that ends a replay (`advance`) moves the counter on: each program
reads the counter before it arrives at a second counter, and the last to arrive (every other has
read by then) stores the next slot and resets the arrivals. Nothing on the host is read at
replay: the graph alone keeps the ring turning.

Tables are filled before a launch reads them; inside a capture the launch reads the table only at
replay, so a capture fills them once it has ended (a copy into them made while capturing would
be captured too). On the CPU (tests) the kernel runs in Triton's interpreter; tensors on the CPU
with the interpreter off (a GPU machine's CPU twins) are copied by `copy_rows_on_host`, the same
rows read by Python.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from replay.context import recorder_kernel
from replay.direct_launch import DirectLauncher

COLUMNS = 5  # source, destination, bytes, ring address, ring stride
BLOCK_BYTES = 8192  # bytes a row (a program) copies at most
WARPS = 8  # with 8 KiB rows, among the fastest of 1-8 warps and 2-16 KiB rows on the H100 (PERFORMANCE.md)


@triton.jit
def _copy_row(row, turn, slots, BLOCK: tl.constexpr):
    source = tl.load(row)
    destination = tl.load(row + 1)
    nbytes = tl.load(row + 2)
    ring = tl.load(row + 3)
    stride = tl.load(row + 4)
    into_ring = ring + (turn % slots) * stride
    # the branches' names differ: the compiler merges a name set in both, and the shapes differ
    if ((source | destination | nbytes | ring | stride) & 7) == 0:
        words = tl.arange(0, BLOCK // 8)
        words_in = words < nbytes // 8
        word = tl.load(source.to(tl.pointer_type(tl.int64)) + words, mask=words_in)
        if destination != 0:
            tl.store(destination.to(tl.pointer_type(tl.int64)) + words, word, mask=words_in)
        if ring != 0:
            tl.store(into_ring.to(tl.pointer_type(tl.int64)) + words, word, mask=words_in)
    else:
        at = tl.arange(0, BLOCK)
        bytes_in = at < nbytes
        byte = tl.load(source.to(tl.pointer_type(tl.uint8)) + at, mask=bytes_in)
        if destination != 0:
            tl.store(destination.to(tl.pointer_type(tl.uint8)) + at, byte, mask=bytes_in)
        if ring != 0:
            tl.store(into_ring.to(tl.pointer_type(tl.uint8)) + at, byte, mask=bytes_in)


@triton.jit(do_not_specialize=["slots"])
def _gather_copy_kernel(rows_ptr, counter_ptr, slots, BLOCK: tl.constexpr, ADVANCE: tl.constexpr):
    turn = tl.load(counter_ptr)
    _copy_row(rows_ptr + tl.program_id(0).to(tl.int64) * 5, turn, slots, BLOCK)  # a row a program
    if ADVANCE:
        tl.debug_barrier()  # every warp of the program has read `turn` (and copied) before it arrives
        arrived = tl.atomic_add(counter_ptr + 1, 1)  # acq_rel: this program's read of `turn` is before it
        if arrived == tl.num_programs(0) - 1:
            tl.store(counter_ptr, turn + 1)
            tl.store(counter_ptr + 1, 0)


def rows(source: int, destination: int, nbytes: int, ring: int = 0, stride: int = 0) -> list[list[int]]:
    """The table rows of one copy of `nbytes` (addresses as integers; 0: no such destination)."""
    return [[source + at, destination + at if destination else 0, min(BLOCK_BYTES, nbytes - at),
             ring + at if ring else 0, stride] for at in range(0, nbytes, BLOCK_BYTES)]


def new_counter(device: torch.device) -> torch.Tensor:
    """A ring's counter and arrivals, zero, made outside any capture (a zeroing made while
    capturing would run at every replay)."""
    return torch.zeros(2, dtype=torch.int64, device=device)


def warm(device: torch.device) -> None:
    """Compile and load both kinds of launch on `device` (before a capture: loading a module
    while capturing is not allowed)."""
    counter = new_counter(device)
    table = torch.tensor([[counter.data_ptr(), 0, 0, 0, 0]], dtype=torch.int64, device=device)
    for advance in (False, True):
        launch(table, counter, 1, advance)


def launch(table: torch.Tensor, counter: torch.Tensor, slots: int, advance: bool) -> None:
    """Copy every row of `table` ([n, COLUMNS] int64 on the copies' device), a program a row, on
    the current stream; with `advance`, move the counter on to the next of `slots` slots."""
    if table.device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        copy_rows_on_host(table, counter, slots, advance)
        return
    with recorder_kernel():  # the recorder's own launch: no call of the program
        _gather_copy_kernel[(table.shape[0],)](table, counter, slots, BLOCK=BLOCK_BYTES, ADVANCE=advance,
                                               num_warps=WARPS)


def copy_rows_on_host(table: torch.Tensor, counter: torch.Tensor, slots: int, advance: bool) -> None:
    """What the kernel does, for tensors in host memory."""
    import ctypes

    turn = int(counter[0])
    for source, destination, nbytes, ring, stride in table.tolist():
        for target in (destination, ring + (turn % slots) * stride if ring else 0):
            if target:
                ctypes.memmove(target, source, nbytes)
    if advance:
        counter[0] = turn + 1


_DIRECT = DirectLauncher(_gather_copy_kernel, {"BLOCK": BLOCK_BYTES, "ADVANCE": False}, num_warps=WARPS)


class FixedCopies:
    """Copies into fixed destinations from sources that move from one launch to the next (a
    verifier check's tensors into its CUDA graph's statics), one launch for them all: the table is
    made once, in pinned host memory the kernel reads, and a launch writes only its sources' rows.
    Through DirectLauncher, past Triton's launch path: five tensors cost the program's thread 21 us,
    where torch's multi-tensor copy cost 32 us (an H200 host, docs/PERFORMANCE.md). The caller
    keeps the table from being written again before the launch that reads it has run (a graph's
    next check comes after its verdict, which comes after its copies)."""

    def __init__(self, destinations: Sequence[tuple[int, int]], device: torch.device) -> None:
        """`destinations`: each copy's destination address and bytes, in the order of the sources."""
        table = [(copy, row) for copy, (address, nbytes) in enumerate(destinations)
                 for row in rows(0, address, nbytes)]
        self.device = device
        self.table = torch.tensor([row for _, row in table] or [[0] * COLUMNS], dtype=torch.int64)
        if device.type == "cuda":
            self.table = self.table.pin_memory()
        self._rows = self.table.numpy()
        self._copy_of_row = np.array([copy for copy, _ in table], dtype=np.int64)  # which source a row reads
        self._offsets = self._rows[:len(table), 0].copy()  # a row's offset into its source
        self._count = len(table)
        self._counter = new_counter(device)  # no ring: read, its value unused

    def launch(self, sources: Sequence[int]) -> None:
        """Copy from `sources` (addresses, as the destinations go) on the current stream."""
        if not self._count:
            return
        self._rows[:self._count, 0] = np.asarray(sources, dtype=np.int64)[self._copy_of_row] + self._offsets
        if self.device.type == "cuda":
            _DIRECT.launch(self.device, (self._count, 1, 1), self.table, self._counter, 1)
        else:
            launch(self.table, self._counter, 1, advance=False)
