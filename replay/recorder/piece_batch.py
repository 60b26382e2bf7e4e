"""A call's tracked stores on one device, checksummed by one launch: rows of the table that
piece_sums.py's kernel reads where the host wrote them, checksums it writes where the host reads
them (pinned memory, which a GPU reads and writes in place), and the event after them: the
call's own, recorded as it goes to the writers (`landed`), one for all its launches.

A call's stores are one batch, launched after its kernel, before the call goes to the writers:
a store made before the call (an input it may change, a blob) reads a copy of its bytes taken
aside on the device then, which it keeps as its staged pieces (chunk_changes.py). Where there is
no such copy (no room for it, or a tensor past chunk_changes.CLONE_BYTES) a row reads the
program's memory, and the batch is launched before the call runs too (`flush_live`). Each store
learns where its checksums will be (a Place: the launch and its first row); the writer that
stores it reads them on the host once that event has passed, and the first to do so gives
the pinned buffer back to the pool. A store whose last store of the same memory is
in the batch not yet launched (one tensor passed twice) has the batch launched first, so that it
compares with checksums that exist. One launch a call rather than one a store: on the H100 a
store with a launch and a copy of its own cost the program's thread 187 us, a row 49 us, and a
call's launch 180 us (docs/PERFORMANCE.md, "One checksum launch a call").

A store staged packed (a room of fewer pieces than it has: chunk_changes.py) learns at its launch
whether its changed pieces fitted: the program's thread waits for that launch and reads how many
each store counted, and where they did not fit, the store's bytes are copied to the host whole
before the program goes on (Place.overflowed), while they are still what the checksums summed.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

import numpy as np
import torch

from replay.recorder import cuda_runtime, cuda_streams
from replay.recorder.latch import Latch
from replay.snapshot.writer import CHUNK_BYTES

# int64 values a piece: its two checksums, whether it changed, and its slot in a packed staged buffer
# (-1: not there; at or past the store's room: it did not fit)
ROW = 4
SLOT = 3
_INT64 = 8  # bytes


@functools.cache
def sums_kernel() -> ModuleType:
    """replay/recorder/piece_sums.py, imported (Triton with it) by the first store tracked, once: an
    import statement where it is used cost a store ~5 us."""
    from replay.recorder import piece_sums
    return piece_sums


class Checksums:
    """One launch's checksums and change flags, [pieces, ROW] int64: on the device, where later
    stores of the same memory compare with them, and on the host once landed."""

    def __init__(self) -> None:
        self.on_device: torch.Tensor | None = None  # uint8, ROW int64 a piece
        self._give_on_device: Callable[[], None] | None = None  # gives on_device back for reuse, once let go
        self._host: np.ndarray | None = None
        self._buffer: torch.Tensor | None = None  # the pooled buffer the kernel writes them in, from its start
        self._give: Callable[[torch.Tensor], None] | None = None
        self._ran: cuda_streams.Landing | None = None  # passes once the launch has run (None: at once)
        self._event: cuda_streams.Landing | None = None
        self._failure: BaseException | None = None
        self._launched = Latch()
        self._lock = threading.Lock()

    @classmethod
    def known(cls, host: np.ndarray) -> "Checksums":
        """Checksums there are on the host already ([pieces, ROW] int64)."""
        checksums = cls()
        checksums._host = host
        checksums._launched.set()
        return checksums

    def gives_back(self, give_on_device: Callable[[], None]) -> None:
        """What takes the device memory of its checksums back once no store can compare with them,
        the launch issued or not (DeviceBuffers.take's)."""
        self._give_on_device = give_on_device

    def launched(self, on_device: torch.Tensor, buffer: torch.Tensor, give: Callable[[torch.Tensor], None],
                 ran: cuda_streams.Landing | None) -> None:
        """The launch is issued: its checksums are `on_device` (bytes: later stores compare with them
        there) and, once landed() says by what event, at the start of `buffer`, given back with
        `give` once read; `ran` passes once the launch has run (None: it has)."""
        self.on_device, self._buffer, self._give, self._ran = on_device, buffer, give, ran

    def landed(self, event: cuda_streams.Landing | None) -> None:
        """Its checksums are on the host once `event` has passed (None: at once, the interpreter's):
        the call's own event after its last copy, one for all its launches (an event cost ~15 us)."""
        self._event = event
        self._launched.set()

    def failed(self, exc: BaseException) -> None:
        self._failure = exc
        self._launched.set()

    def synchronize(self) -> None:
        """Wait until the checksums are on the host (a launch failed: its error)."""
        self._launched.wait()
        if self._failure is not None:
            raise self._failure
        if self._event is not None:
            self._event.synchronize()

    def query(self) -> bool:
        """Whether the checksums are on the host, without waiting (a failed launch: True, for
        synchronize() to raise)."""
        if not self._launched.is_set():
            return False
        return self._failure is not None or self._event is None or self._event.query()

    def host(self) -> np.ndarray:
        """Every row on the host, waiting for the launch (the pinned buffer goes back then)."""
        with self._lock:
            if self._host is None:
                self.synchronize()
                assert self.on_device is not None and self._buffer is not None and self._give is not None
                written = self._buffer.numpy()[:self.on_device.numel()]  # the sums lead the buffer
                self._host = written.view(np.int64).reshape(-1, ROW).copy()
                self._give(self._buffer)
                self._buffer = None
            return self._host

    def address(self, row: int) -> int:
        """Where row `row` is on the device (the launch is issued)."""
        assert self.on_device is not None
        return self.on_device.data_ptr() + row * ROW * _INT64

    def __del__(self) -> None:
        # launched and never read (its call abandoned, its writer failed): the kernel reads its table
        # and writes its checksums in the pinned buffer in place, so the buffer goes back only once
        # the launch has run (else the next take could hand it out under the kernel). Rare: waited for.
        if self._buffer is not None and self._give is not None:
            if self._ran is not None:
                with contextlib.suppress(Exception):  # a broken device runs nothing more
                    self._ran.synchronize()
            self._give(self._buffer)
        # no later store compares with these: the launches reading them are queued on the stream
        # their memory is reused on (device_buffers.py)
        if self._give_on_device is not None:
            self._give_on_device()


@dataclass(slots=True)  # not frozen: made for each tracked store, and a frozen one costs twice as much
class Place:
    """Where one store's checksums are: rows start..start+pieces of a launch's. A packed store's
    `room` (pieces its staged buffer holds) and what its launch calls, with host memory the device
    writes (`take`, `give`), where its changed pieces did not fit there (set by its tracker)."""
    checksums: Checksums
    start: int
    pieces: int
    room: int = 0
    overflowed: Callable[[Callable[[int], torch.Tensor], Callable[[torch.Tensor], None]], None] | None = None

    def rows(self) -> np.ndarray:
        return self.checksums.host()[self.start:self.start + self.pieces]


def _let_go_of_tensors(packed: list[Place]) -> None:
    """What a packed store's launch would have called on overflow holds the program's tensor (a
    cache of GBs, which its last store outlives): let go once its launch is checked, or never will be."""
    for place in packed:
        place.overflowed = None


def _copy_counts(counters: torch.Tensor, host: torch.Tensor) -> None:
    """Queue the packed stores' counters into host memory the device writes, after the launch."""
    runtime = cuda_runtime.on_current_device(counters.device)
    if runtime is None:
        host.copy_(counters, non_blocking=True)
        return
    runtime.copy_to_host(host.data_ptr(), counters.data_ptr(), counters.numel(),
                         runtime.current_stream(counters.device.index))


def _zero(counters: torch.Tensor) -> None:
    """Zero device memory on its device's current stream (through the runtime: no torch operator)."""
    runtime = cuda_runtime.on_current_device(counters.device)
    if runtime is None:
        counters.zero_()
        return
    runtime.memset(counters.data_ptr(), 0, counters.numel(), runtime.current_stream(counters.device.index))


class PieceBatch:
    """The stores a call makes on one device that wait for their launch. `take(nbytes)` gives host
    memory the device reaches in place (a GPU: a pooled pinned buffer; the interpreter: any) and
    `give` takes it back once its checksums are read; `on_device(nbytes)` gives device memory for
    the checksums later stores compare with, and what gives it back (DeviceBuffers.take's)."""

    def __init__(self, device: torch.device, take: Callable[[int], torch.Tensor],
                 give: Callable[[torch.Tensor], None],
                 on_device: Callable[[int], tuple[torch.Tensor, Callable[[], None]]]) -> None:
        self.device = device
        self._take, self._give, self._on_device = take, give, on_device
        self._rows: list[list[Any]] = []  # piece_sums.COLUMNS each; the sums column a row number until launched
        self._pieces = 0
        self._programs = 0
        self._live = False  # a row reads memory the program owns (not a copy aside): launched before its call runs
        self._pending: Checksums | None = None  # the checksums of the rows not launched yet, made by the first
        # what the rows name by address, alive until the launch is issued (memory freed before it
        # would be another's by then)
        self._held: list[Any] = []
        self._unlanded: list[Checksums] = []  # launched, waiting for the call's event (landed())
        self._packed: list[Place] = []  # the rows' packed stores, whose rooms the launch checks

    def comparable(self, last: Place) -> bool:
        """Whether a store can compare with `last` here: its launch issued, or this batch's own
        (another thread's call that has not launched yet: compared with nothing)."""
        return self.pending(last) or last.checksums.on_device is not None

    def pending(self, place: Place) -> bool:
        """Whether `place` is this batch's, not launched yet."""
        return place.checksums is self._pending

    def add(self, address: int, nbytes: int, owner: torch.Tensor, last: Place | None, staged: torch.Tensor | None,
            live: bool = True, room: int = 0) -> Place:
        """A store of the `nbytes` at `address` (trackable; in `owner`'s storage, held until the
        launch is issued) compared with `last` (None: every piece new), its changed pieces copied
        into `staged` where given: each where it lies, or with a `room` (pieces), packed into its
        slots there. `live`: the bytes are the program's memory, which its call may change (not a
        copy the recorder took aside)."""
        kernel = sums_kernel()
        if last is not None and self.pending(last):
            self.launch()  # what it compares with must be summed first
        pieces = -(-nbytes // CHUNK_BYTES)
        if self._pending is None:
            self._pending = Checksums()
        place = Place(self._pending, self._pieces, pieces, room if staged is not None else 0)
        row = [0] * kernel.COLUMNS
        row[kernel.WORDS_AT], row[kernel.NWORDS], row[kernel.FIRST] = address, nbytes // 4, self._programs
        row[kernel.SUMS] = row[kernel.HOST_SUMS] = self._pieces  # rows into the launch's tables, made addresses then
        row[kernel.LAST] = last.checksums.address(last.start) if last is not None else 0
        row[kernel.STAGED] = staged.data_ptr() if staged is not None else 0
        if place.room:
            row[kernel.ROOM], row[kernel.COUNTER] = room, len(self._packed)  # its counter's number, an address at launch
            self._packed.append(place)
        self._rows.append(row)
        self._held += [owner, staged, last.checksums if last is not None else None]
        self._pieces += pieces
        self._programs += kernel.programs_of(pieces)
        self._live = self._live or live
        return place

    def flush_live(self) -> None:
        """Launch now if a row reads the program's own memory (a call about to run may change it);
        rows reading copies aside wait for the launch after the call."""
        if self._live:
            self.launch()

    def flush(self) -> None:
        """launch(), then landed() with an event of its own: the stores' checksums readable alone."""
        self.launch()
        self.landed(self._event_now())

    def _event_now(self) -> cuda_streams.Landing | None:
        """An event after the work issued on the batch's device so far (None: the interpreter's, done)."""
        return cuda_streams.event_now(self.device) if self.device.type == "cuda" else None

    def launch(self) -> None:
        """Launch the checksums of the stores added since the last launch, on the batch's device's
        current stream. The kernel reads the table where the host wrote it and writes the checksums
        both on the device and where the writers read them (host memory from `take`: on a GPU,
        pinned, which the device reads and writes in place): a launch, no copies (made on the
        batch's device whichever is current: direct_launch.py). Readers wait for landed()."""
        if not self._rows:
            return
        kernel = sums_kernel()
        rows, pieces, programs, checksums = self._rows, self._pieces, self._programs, self._pending
        assert checksums is not None  # a batch with rows has them
        held = self._held  # let go once the launch is issued: freed memory is reused in stream order
        packed = self._packed
        self._rows, self._pieces, self._programs, self._pending, self._held, self._packed = [], 0, 0, None, [], []
        self._live = False
        launched = False
        give_counters = None
        try:
            sums_bytes = pieces * ROW * _INT64
            sums, give_sums = self._on_device(sums_bytes)
            checksums.gives_back(give_sums)
            table = np.array(rows, dtype=np.int64)
            counted = sums_bytes + table.nbytes  # where the packed stores' counts come back, past the table
            buffer = self._take(counted + len(packed) * _INT64)  # the sums first: 8-byte aligned, as the table
            table[:, kernel.SUMS] = sums.data_ptr() + table[:, kernel.SUMS] * (ROW * _INT64)
            table[:, kernel.HOST_SUMS] = buffer.data_ptr() + table[:, kernel.HOST_SUMS] * (ROW * _INT64)
            if packed:  # each packed store's slot counter, zero before the launch
                counters, give_counters = self._on_device(len(packed) * _INT64)
                rooms = table[:, kernel.ROOM] != 0
                table[rooms, kernel.COUNTER] = counters.data_ptr() + table[rooms, kernel.COUNTER] * _INT64
                _zero(counters)
            buffer.numpy()[sums_bytes:sums_bytes + table.nbytes] = table.view(np.uint8).reshape(-1)
            kernel.launch(buffer.data_ptr() + sums_bytes, len(rows), programs, self.device)  # never a program's call
            launched = True
            del held
            if packed:
                _copy_counts(counters, buffer[counted:counted + counters.numel()])
            ran = self._event_now()  # ~1 us, the runtime's
            checksums.launched(sums, buffer, self._give, ran)
            self._unlanded.append(checksums)
            if packed:
                self._check_rooms(packed, buffer.numpy()[counted:counted + counters.numel()].view(np.int64), ran)
        except BaseException as exc:
            if launched and self.device.type == "cuda":  # what it reads and writes may go once it has run
                with contextlib.suppress(Exception):
                    torch.cuda.current_stream(self.device).synchronize()
            checksums.failed(exc)
            raise
        finally:
            if give_counters is not None:  # reused in stream order, after the launch that counts in it
                give_counters()
            _let_go_of_tensors(packed)

    def _check_rooms(self, packed: list[Place], counts: np.ndarray, ran: cuda_streams.Landing | None) -> None:
        """Wait for the launch and the copy of its counters, and copy whole to the host each packed
        store whose changed pieces did not fit its room (the program has issued nothing since:
        its bytes are as summed). `counts`: each store's counter as it came back (int32, zero-padded)."""
        if ran is not None:
            ran.synchronize()
        for place, count in zip(packed, counts.tolist()):
            if place.overflowed is not None and count > place.room:
                place.overflowed(self._take, self._give)

    def landed(self, event: cuda_streams.Landing | None) -> None:
        """The launches made so far are behind `event` (None: done, the interpreter's): their readers go on."""
        unlanded, self._unlanded = self._unlanded, []
        for checksums in unlanded:
            checksums.landed(event)

    def failed(self, exc: BaseException) -> None:
        """The launches made so far have no event to wait for: their readers are told `exc`."""
        unlanded, self._unlanded = self._unlanded, []
        for checksums in unlanded:
            checksums.failed(exc)

    def __del__(self) -> None:
        # never launched, or never landed (its call dropped mid-way): whoever reads its checksums is
        # told, not kept waiting
        dropped = RuntimeError("the recorder dropped these stores before their checksums were launched")
        if self._rows and self._pending is not None:
            self._pending.failed(dropped)
        self.failed(dropped)
        _let_go_of_tensors(self._packed)
