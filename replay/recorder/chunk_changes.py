"""Which 64 KiB pieces of a large tensor changed since it was last stored, decided on the GPU,
and only those brought to the host.

A KV cache that a decode step writes 64 KiB of is stored in content-addressed pieces (format 3);
copying all of it to the host and hashing it there at every call costs far more than the step.
So, where the tensor lives on a GPU, one kernel (piece_sums.py) checksums each piece, compares
the checksums with those of the last store from the same memory, and copies the pieces that
differ into a device buffer, all on the program's stream with no synchronisation; one launch
serves every store a call makes at once (piece_batch.py), after the call runs. A store before
the call (its inputs, which it may change) up to CLONE_BYTES copies every piece aside on the
device instead, and the launch reads that copy: a device copy costs the program's thread far less
than a second launch a call, and the device memory is the same, the staged buffer being whole
pieces either way. A store after the call of the same memory compares with what that copy
compares with (their launch is one). The kernel writes the flags where the writers read them
(pinned host memory); a writer thread then brings only the flagged pieces over (one gather and
one copy, on a stream of its own), hashes them, and takes the others' sha256 from that last
store. Correctness rests on the checksums alone, not on the memory being the same tensor: equal
checksums mean equal bytes but for odds far below any hardware fault's (piece_sums.py), so a
piece named by a reused digest holds what the digest says.

A store that finds no room to stage its whole size in (DEVICE_STAGING_BYTES; a blocking recording
first waits a while on the host for its writers to let staged stores go) is staged packed: its
changed pieces take consecutive slots of a room of PACKED_ROOM_BYTES, so that a KV cache of many GB
that a decode step writes 64 KiB of stages 64 KiB, not its size. The program's thread then waits
for its launch (piece_batch.py) to learn whether they fitted; where they did not, or where there is
no room at all, the store comes to the host whole, still flagging what changed, so the writer
hashes only that. A flight recording stages as a full one does and brings a store's changed pieces
to the host once its launch has run (settle(): HeldPieces), to hold them until a dump
(flight_pieces.py).
Beyond the store before: pieces alike within a store come over and are hashed once, a piece any
store of the recording hashed is known by its checksums and length (up to SEEN_PIECES of them,
then the cache starts again), and a store that changed nothing takes the store before's list whole,
as does a store whose every checksum is a whole earlier store's (a training step's activations,
alike each step, in other memory). A large read-only tensor on the GPU (a blob) is checksummed and
copied aside on the device alike, and comes over only if the recording never stored those bytes.

On the CPU the host does the work either way and sha256 is as fast as the checksum, so only
CUDA tensors are tracked (DEVICES).
"""
from __future__ import annotations

import contextlib
import mmap
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import InitVar, dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from replay.recorder import cuda_runtime
from replay.recorder.device_buffers import DeviceBuffers, nothing
from replay.recorder.latch import Latch
from replay.recorder.piece_batch import SLOT, PieceBatch, Place, sums_kernel
from replay.snapshot import hashing
from replay.snapshot.chunk_lists import ChunkList
from replay.snapshot.hashing import Known
from replay.snapshot.tensors import Geometry, geometry_of
from replay.snapshot.writer import CHUNK_BYTES

DEVICES = ("cuda",)  # where pieces are checksummed; tests add "cpu" to run the same logic there
# Device memory the staged pieces of stores not yet fetched may hold. Past it the program waits for
# the writers to let go of some, as for a full queue; where they hold none (the call being made holds
# it all), where the recording drops calls rather than wait, or where the device has no room left, a
# store is copied whole to the host on the program's stream, as untracked ones are. A training
# step's activations and logits pass 1 GiB in flight.
DEVICE_STAGING_BYTES = 4 << 30
# The longest a store waits for room; a wait in vain (bytes held by stores no writer will take)
# is not waited again until some come back.
STAGING_WAIT_S = 5.0
# Blobs from this size up are checksummed on the device; a smaller one costs less to copy and hash
# than the launch that would spare it.
DEVICE_BLOB_BYTES = 1 << 20
SEEN_PIECES = 1 << 18  # pieces known by checksums at most (~60 MB of host memory), then forgotten
# Memories whose last store's checksums are kept (on the device, 24 bytes a piece), the least recently
# stored forgotten past it: a program that stores ever new memory does not hold every store's checksums.
# A forgotten memory's next store compares with nothing (every piece staged, as a first store).
MEMORIES_KEPT = 1 << 13
# A store before its call up to this size is copied aside whole on the device, so that its checksums
# wait for the launch after the call (one launch a call, not two). The copy costs the device two more
# passes over the bytes (copied, then read) where summing them in place before the call and copying
# the changed pieces costs one: at ~3 TB/s, 128 MiB cost ~90 us of the device, less than the launch
# before the call would cost the program's thread (110-160 us in a recording on the H200; a
# recording's steps are bound by the program's thread, not the device: docs/PERFORMANCE.md). A
# larger tensor (a KV cache of GBs a decode step writes 64 KiB of) is summed in place, in a launch
# before the call. 128 MiB holds a 32000-word vocabulary's logits for 2048 tokens in bf16.
CLONE_BYTES = 128 << 20
# The room a store too large to stage whole stages its changed pieces in, packed. A decode step
# changes a few pieces of a cache, a prefill of 2048 tokens 16 MiB of a 7B layer's: a room of 256 MiB
# copies the whole store to the host only where a call rewrote more of it than that.
PACKED_ROOM_BYTES = 256 << 20
_side_streams: dict[torch.device, torch.cuda.Stream] = {}
_ZEROS = np.zeros(CHUNK_BYTES, dtype=np.uint8)  # the bytes of a piece of zeros a pack needs (never written)


Checksums = dict[tuple[int, int, int], str]  # (checksums, length) of a piece -> its sha256


@dataclass
class KnownContent:
    """What the recording stored, named by device checksums: pieces (checksums and length ->
    sha256), whole chunked stores (content key -> the pieces' sha256 and the chunk list) and blobs
    (content key and dtype -> digest). A cache of bounded size: past SEEN_PIECES pieces, the
    pieces and blobs start again, and the stores least recently met go first (a cache whose
    bytes never repeat does not push out a step's activations that do). Shared by the writer
    threads: a store's use takes a lock; the others are one dict operation each."""
    pieces: Checksums = field(default_factory=dict)
    blobs: dict[tuple[bytes, str], str | ChunkList] = field(default_factory=dict)
    _stores: OrderedDict[bytes, tuple[list[str], ChunkList]] = field(default_factory=OrderedDict)
    _store_pieces: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def remember_pieces(self, named: list[tuple[tuple[int, int, int], str]]) -> None:
        if len(self.pieces) > SEEN_PIECES:
            self.pieces.clear()
        self.pieces.update(named)

    def store(self, key: bytes) -> tuple[list[str], ChunkList] | None:
        """The piece digests and chunk list of a store with content key `key`, if one was stored."""
        with self._lock:
            found = self._stores.get(key)
            if found is not None:
                self._stores.move_to_end(key)
            return found

    def remember_store(self, key: bytes, digests: list[str], chunk_list: ChunkList) -> None:
        with self._lock:
            if key in self._stores:
                self._stores.move_to_end(key)
                return
            self._stores[key] = (digests, chunk_list)
            self._store_pieces += len(digests)
            while self._store_pieces > SEEN_PIECES and len(self._stores) > 1:
                _, (forgotten, _) = self._stores.popitem(last=False)
                self._store_pieces -= len(forgotten)

    def remember_blob(self, key: tuple[bytes, str], digest: str | ChunkList) -> None:
        if len(self.blobs) > SEEN_PIECES:
            self.blobs.clear()
        self.blobs[key] = digest


@dataclass
class HeldPieces:
    """Pieces of a store held on the host (a flight recording's): piece n's bytes at slot
    `slots[n]` of `host` (in a pooled buffer `give_back` returns), and the pieces of zeros, known
    by their checksums and held without bytes. A store held whole over zeros whose pages are made
    only where written (unmade_zeros: a flight recording's base) names the pieces it wrote bytes
    into (`resident`): the others' pages were never made, and they count nothing."""
    host: np.ndarray
    slots: dict[int, int]
    zeros: set[int] = field(default_factory=set)
    give_back: Callable[[], None] = nothing
    resident: set[int] | None = None  # None: every page of `host` is made

    @property
    def nbytes(self) -> int:
        return self.host.nbytes if self.resident is None else len(self.resident) * CHUNK_BYTES

    def has(self, piece: int) -> bool:
        return piece in self.slots or piece in self.zeros

    def covers(self, pieces: int) -> bool:
        """Whether every one of a store's `pieces` is held (or zeros): the store, whole."""
        return len(self.slots) + len(self.zeros) >= pieces

    def piece(self, piece: int, length: int) -> np.ndarray:
        slot = self.slots.get(piece)
        return _ZEROS[:length] if slot is None else self.host[slot * CHUNK_BYTES:slot * CHUNK_BYTES + length]

    def write_into(self, whole: HeldPieces, nbytes: int) -> None:
        """Write these pieces (zeros too) into `whole`, a store's `nbytes` held piece n at n; a
        piece of zeros where `whole` never wrote bytes is zeros there already, and is left unmade."""
        resident = whole.resident
        for n in [*self.slots, *(self.zeros if resident is None else self.zeros & resident)]:
            at = n * CHUNK_BYTES
            length = min(CHUNK_BYTES, nbytes - at)
            whole.host[at:at + length] = self.piece(n, length)
        if resident is not None:
            resident.update(self.slots)

    def copy(self) -> HeldPieces:
        """A copy of a store held whole, its unmade pages left unmade."""
        if self.resident is None:
            return HeldPieces(self.host.copy(), self.slots)
        host = unmade_zeros(self.host.nbytes)
        for first, end in consecutive_runs(sorted(self.resident)):
            host[first * CHUNK_BYTES:end * CHUNK_BYTES] = self.host[first * CHUNK_BYTES:end * CHUNK_BYTES]
        return HeldPieces(host, self.slots, resident=set(self.resident))


def unmade_zeros(nbytes: int) -> np.ndarray:
    """`nbytes` of zeros (uint8) whose pages are made only where written: anonymous memory in small
    pages. numpy's zeros come from calloc, which may reuse heap memory (made, and cleared), and
    asks for pages of 2 MiB past 4 MiB, where one 64 KiB piece written makes its whole page."""
    if not nbytes:
        return np.zeros(0, dtype=np.uint8)
    memory = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(memory, dtype=np.uint8)  # the array holds the mapping: unmapped with it


@dataclass
class PieceHistory:
    """One store of a tracked tensor: where its checksums are (`place`: every piece's two checksums
    and whether it differs from the store before it from the same memory, on the host once their
    launch has run; `compared` False: there was no store before, all may differ), where the
    changed pieces wait on the device (`staged`, when they were not copied to the host whole), and,
    once the writer has hashed them, every piece's sha256. `recorded` is what the recording stored,
    by checksums."""
    previous: PieceHistory | None
    place: Place
    compared: bool
    recorded: KnownContent
    staged: torch.Tensor | None = None  # whole pieces of bytes, the changed ones written (or packed: place.room)
    nbytes: int = 0  # the tensor's bytes (the last piece of `staged` is padded)
    cloned: bool = False  # `staged` holds every piece, copied before its call: the checksums read that copy
    digests: list[str] | None = None
    chunk_list: ChunkList | None = None  # the list of `digests`, as stored
    _done: Latch = field(default_factory=Latch)
    _let_go: Callable[[int], None] = lambda nbytes: None  # gives the staged bytes back to the budget
    # gives the staged buffer back for reuse (DeviceBuffers): held by the _Hold alone, which lets go of it
    give_staged: InitVar[Callable[[], None]] = nothing
    _key: bytes | None = None
    _changed_pieces: np.ndarray | None = None  # changed_pieces, once found
    # stores that compare with this one and were neither written, nor failed, nor forgotten by a flight
    # recording's ring (which keeps the bytes of a store it forgets while some are left: flight_pieces.py)
    successors: int = 0
    memory: tuple[torch.device, int, int] | None = None  # what the tracker knows its memory by
    held: HeldPieces | None = None  # its changed pieces on the host (settle())

    def __post_init__(self, give_staged: Callable[[], None]) -> None:
        if self.previous is not None:
            self.previous.successors += 1
        # held by this store alone: one dropped unwritten (its call abandoned) gives its bytes back as it goes
        self._hold = _Hold(self.staged.numel() if self.staged is not None else 0, self._let_go, give_staged)

    @property
    def sums(self) -> np.ndarray:
        """Each piece's two checksums ([pieces, 2] int64), waiting for their launch."""
        return self.place.rows()[:, :2]

    @property
    def staging_bytes(self) -> int:
        """The device memory its staging takes (its packed room, or its whole pieces), staged or not."""
        return (self.place.room or self.place.pieces) * CHUNK_BYTES

    @property
    def changed(self) -> np.ndarray | None:
        """Whether each piece differs from the store before (None: there was none to compare with)."""
        return self.place.rows()[:, 2] if self.compared else None

    @property
    def changed_pieces(self) -> np.ndarray | None:
        """The pieces that differ from the store before, by number (None: there was none to compare
        with): found once, for the key, the digests known and those remembered. (Not a
        cached_property: in Python 3.11 that holds one lock for every store while `changed` may
        wait for a launch, and two writers finding the same array is harmless.)"""
        if self._changed_pieces is None:  # looked at first: the flags' column is a view made at each reading
            changed = self.changed
            if changed is None:
                return None
            # compared to zero first: numpy finds the true ones of a bool array in a third of the time
            self._changed_pieces = np.flatnonzero(changed != 0)
        return self._changed_pieces

    def known(self) -> Known | None:
        """The sha256 of each piece that did not change since the store before (None where it did),
        and where it did; None when the store before was not hashed. Waits for that store's writer."""
        previous = self.leave_previous()  # the chain of stores is let go as it is written
        pieces = self.changed_pieces
        if previous is None or pieces is None:
            return None
        previous._done.wait()
        before = previous.digests
        if before is None or len(before) != self.place.pieces:
            return None
        known: list[str | None] = list(before)
        changed = pieces.tolist()
        for n in changed:  # a few of a cache's many pieces: not a pass over each
            known[n] = None
        return Known(known, changed, changed, previous.chunk_list)

    def stored_before(self) -> tuple[list[str], ChunkList] | None:
        """Where no piece changed since the store before, its digests and chunk list (waiting for
        its writer), which are this store's too; else, where the recording stored these very bytes
        before (every checksum alike), that store's. A decode step's cache as the step before left
        it, or a training step's activations alike each step, cost no work a piece."""
        previous = self.previous
        changed = self.changed_pieces
        if previous is not None and changed is not None and not len(changed):
            previous._done.wait()
            if previous.digests is not None and previous.chunk_list is not None:
                if self.nbytes == previous.nbytes:  # its checksums are the store before's: so is its key
                    self._key = previous._key
                return previous.digests, previous.chunk_list
        return self.recorded.store(self.content_key())

    def content_key(self) -> bytes:
        """What names this store's bytes, from the checksums on the host: equal keys, equal bytes
        (but for the checksums' odds, piece_sums.py, and sums_key's)."""
        if self._key is None:
            self._key = self._key_from_previous() or sums_key(self.sums) + self.nbytes.to_bytes(8, "little")
        return self._key

    def _key_from_previous(self) -> bytes | None:
        """The store before's key (when its writer worked it out already) moved by the pieces that
        changed since, where they are few: a decode step's row of a cache of GBs costs its changed
        pieces' terms, not a pass over every checksum (sums_key is a sum of a term a piece)."""
        previous, pieces = self.previous, self.changed_pieces
        known = previous._key if previous is not None else None  # read once: another writer may set it
        if known is None or pieces is None or previous is None or previous.nbytes != self.nbytes:
            return None
        if len(pieces) * _FEW_CHANGED > self.place.pieces:
            return None
        return moved_key(known[:16], previous.sums[pieces], self.sums[pieces], pieces) + known[16:]

    def plan(self, known: Known | None
             ) -> tuple[list[str | None], dict[int, int], list[int], list[int]]:
        """What is known of each piece (`known`, the pieces any store hashed: the same checksums
        and length, and pieces of zeros, whose checksums are zero), which piece of this store holds
        the bytes of each that is not (pieces alike in one store; its keys, in order, are where the
        first list holds None), those first pieces, the ones wanted, and the pieces of zeros (named
        without their bytes, which a pack may still need: they are zeros). `known`'s list is made
        the first list, not copied (as long as the store's pieces: 81,920 for a cache of 5 GiB, each
        copy ~0.1 ms): after it, only `known.fresh` and `known.listed` are read (after_plan)."""
        pieces = len(self.sums)
        resolved: list[str | None] = known.digests if known is not None else [None] * pieces
        alike: dict[int, int] = {}
        firsts: dict[tuple[int, int, int], int] = {}
        wanted, zeros = [], []
        for n, key in self._keys(known.unknown if known is not None else list(range(pieces))):
            if key[0] == key[1] == 0:  # no other bytes sum to zero twice, but for the checksums' odds
                resolved[n] = hashing.zero_digest(key[2])
                zeros.append(n)
                continue
            resolved[n] = self.recorded.pieces.get(key)
            if resolved[n] is None:
                alike[n] = firsts.setdefault(key, n)
                if alike[n] == n:
                    wanted.append(n)
        return resolved, alike, wanted, zeros

    def fetch(self, known: Known | None, take: Callable[[int], torch.Tensor]
              ) -> tuple[list[np.ndarray | None], Known, torch.Tensor | None]:
        """The staged pieces the plan wants, on the host (pieces alike listed as one array, None for
        the known), what is known of each (and where nothing is: the pieces to hash), and the host
        buffer (from `take`) the pieces are views into, to give back once they are written. Called
        on a writer thread once the call's copies landed: one gather and one copy on a stream of
        its own."""
        resolved, alike, wanted, zeros = self.plan(known)
        found: list[np.ndarray | None] = [None] * len(resolved)
        held, buffer = self.held, None
        if held is not None:  # on the host already: what was not brought over is not there
            if not all(held.has(n) for n in wanted):
                raise OSError("the pieces this store shares with the one before were never written")
            for n in wanted:
                found[n] = held.piece(n, self._length(n))
        else:
            if self.staged is None:
                raise OSError("its staged pieces were lost before they came to the host")
            try:
                if known is None and not self.cloned and self.changed is not None and not bool(self.changed.all()):
                    raise OSError("the pieces this store shares with the one before were never written")
                host, buffer, at = self._bring_over(wanted, take)
            finally:
                self._release_staged()
            for n in wanted:
                found[n] = host[at[n] * CHUNK_BYTES:at[n] * CHUNK_BYTES + self._length(n)]
        for n, first in alike.items():
            found[n] = found[first]
        for n in zeros:
            found[n] = _ZEROS[:self._length(n)]
        return found, after_plan(known, resolved, alike), buffer

    def landed(self) -> bool:
        """Whether its checksums (and staged pieces) are done, without waiting."""
        return self.place.checksums.query()

    def settle(self, take: Callable[[int], torch.Tensor], give: Callable[[torch.Tensor], None]) -> None:
        """Bring its changed pieces (every piece, where it compared with nothing) but those of
        zeros from the device into a host buffer from `take`, given back with `give` once written
        or forgotten, and let the staged device memory go: what a flight recording holds of a
        store (held). A fresh cache of zeros brings nothing over."""
        sums, changed = self.sums, self.changed
        wanted = np.ones(len(sums), dtype=bool) if changed is None else changed.astype(bool)
        zero = wanted & (sums[:, 0] == 0) & (sums[:, 1] == 0)  # as plan() names them
        fetched = np.flatnonzero(wanted & ~zero).tolist()
        try:
            host, buffer, at = self._bring_over(fetched, take)
        finally:
            self._release_staged()
        self.held = HeldPieces(host, at, set(np.flatnonzero(zero).tolist()),
                               (lambda: give(buffer)) if buffer is not None else nothing)

    def take_whole(self, run: _Run, take: Callable[[int], torch.Tensor],
                   give: Callable[[torch.Tensor], None]) -> None:
        """Its changed pieces overflowed its packed room: its bytes come to the host whole now (its
        launch has run, and the program issued nothing since), held as a store held whole, and the
        staged buffer goes."""
        nbytes = self.place.pieces * CHUNK_BYTES
        buffer = take(nbytes)
        run.copy_to_host(buffer)
        self.held = HeldPieces(buffer.numpy()[:nbytes], in_order(self.place.pieces), give_back=lambda: give(buffer))
        self._release_staged()

    def leave_previous(self) -> PieceHistory | None:
        """Stop comparing with the store before (written, failed or forgotten): it has one
        successor less. That store, returned."""
        previous, self.previous = self.previous, None
        if previous is not None:
            previous.successors -= 1
        return previous

    def release_held(self) -> None:
        held, self.held = self.held, None
        if held is not None:
            held.give_back()

    def whole(self, take: Callable[[int], torch.Tensor]) -> tuple[np.ndarray, torch.Tensor | None]:
        """A store staged whole (a blob's), on the host, and the pooled buffer (from `take`) it is
        in, to give back once written; its device memory let go."""
        try:
            host, buffer, _ = self._bring_over(list(range(len(self.sums))), take)
        finally:
            self._release_staged()
        return host[:self.nbytes], buffer

    def _bring_over(self, wanted: list[int], take: Callable[[int], torch.Tensor]
                    ) -> tuple[np.ndarray, torch.Tensor | None, dict[int, int]]:
        """The staged pieces `wanted` on the host, the pooled buffer they are in, and where each is
        there (piece n at at[n]): one after another, or, packed, all the store's slots in one run."""
        assert self.staged is not None
        if not wanted:  # nothing changed: nothing comes over
            return np.empty(0, dtype=np.uint8), None, {}
        staged = self.staged
        if self.place.room:
            slots = self.place.rows()[:, SLOT]  # -1 for the pieces not there
            where = {n: int(slots[n]) for n in wanted}
            if not 0 <= min(where.values()) <= max(where.values()) < self.place.room:  # take_whole's to bring
                raise OSError("its changed pieces passed its packed room and were not taken whole")
            runs = [(0, max(where.values()) + 1)]
        else:
            where = {n: slot for slot, n in enumerate(wanted)}
            runs = consecutive_runs(wanted)
        if not staged.is_cuda:
            return torch.cat([staged[start * CHUNK_BYTES:end * CHUNK_BYTES] for start, end in runs]).numpy(), None, where
        stream = _side_streams.get(staged.device)
        if stream is None:
            stream = _side_streams[staged.device] = torch.cuda.Stream(staged.device)
        buffer = take(sum(end - first for first, end in runs) * CHUNK_BYTES)
        runtime = cuda_runtime.on_current_device(staged.device)
        if runtime is not None:  # queued by address with the interpreter lock kept: no torch operator a run
            def copy_run(at: int, start: int, size: int) -> None:
                runtime.copy_to_host(buffer.data_ptr() + at, staged.data_ptr() + start, size, stream.cuda_stream)
            issuing: Any = contextlib.nullcontext()
        else:
            def copy_run(at: int, start: int, size: int) -> None:
                buffer[at:at + size].copy_(staged[start:start + size], non_blocking=True)
            issuing = torch.cuda.stream(stream)
        try:  # a run at a time, straight into the pinned buffer: no device memory beyond the staged
            with issuing:
                at = 0
                for first, end in runs:
                    size = (end - first) * CHUNK_BYTES
                    copy_run(at, first * CHUNK_BYTES, size)
                    at += size
        finally:  # nothing is let go while the stream may still read it or write into the buffer
            stream.synchronize()
        return buffer.numpy(), buffer, where

    def _length(self, piece: int) -> int:
        return min(CHUNK_BYTES, self.nbytes - piece * CHUNK_BYTES)

    def _keys(self, pieces: list[int]) -> list[tuple[int, tuple[int, int, int]]]:
        """Each of `pieces` with what names its content: its checksums and length."""
        sums = self.sums[pieces].tolist()
        last = len(self.sums) - 1  # the only piece that may be short
        return [(n, (first, second, CHUNK_BYTES if n != last else self._length(n)))
                for n, (first, second) in zip(pieces, sums)]

    @property
    def failed(self) -> bool:
        """The writer is done with this store and did not write it (its call failed or was dropped)."""
        return self._done.is_set() and self.digests is None

    def hashed(self, digests: list[str] | None, chunk_list: ChunkList | None = None,
               new: list[int] | None = None) -> None:
        """The writer is done with this store (`digests` None: it failed, or never wrote it; else
        `chunk_list` is their list as stored); the pieces it hashed (`new`, by
        number; None: every changed one) are known by their checksums from now on, and the whole
        store by its content key."""
        self._release_staged()
        self.release_held()
        if self._done.is_set():
            return
        self.leave_previous()
        if digests is not None:
            if new is None:
                every = range(len(digests))
                changed = self.changed_pieces
                new = changed.tolist() if changed is not None else list(every)
            if new:
                self.recorded.remember_pieces([(key, digests[n]) for n, key in self._keys(new)])
            if chunk_list is not None:
                self.recorded.remember_store(self.content_key(), digests, chunk_list)
        self.digests, self.chunk_list = digests, chunk_list
        self._done.set()

    def _release_staged(self) -> None:
        self.staged = None
        self._hold.give_back()


# the multipliers of sums_key (golden-ratio-like) and of its mixer (splitmix64's), odd but the
# fourth: with one even, (x, y) -> (x ^ y*odd, y ^ x*even) is one-to-one (bit j of the second
# gives y's, then the first x's: each depends on lower bits only), with both odd it is not
_MULTIPLIERS = [np.uint64(k) for k in (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                                       0xD6E8FEB86659FD92, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB)]
_SHIFT_BITS = (30, 27, 31)
_SHIFTS = [np.uint64(k) for k in _SHIFT_BITS]


# a store's key is moved from the store before's where at most one piece in this many changed: past
# that, terms of both stores' changed pieces cost about what one pass over every checksum does
_FEW_CHANGED = 4


def sums_key(sums: np.ndarray) -> bytes:
    """16 bytes naming a store's checksums ([pieces, 2] int64, strided or not), in numpy with no
    copy of them: each checksum mixed with its piece's place by splitmix64's finaliser, the two
    mixed into each other both ways (a piece's two terms a one-to-one function of its checksums
    at its place: _MULTIPLIERS), each way summed over the pieces modulo 2^64. Two different
    arrays collide only where both sums of well-mixed terms agree (~2^-128 for changes not built
    to collide: the checksums under it are no defence against built ones either). Each checksum
    is mixed on its own first: mixing XORs of their multiples left structured changes (a piece's
    checksums negated, as an int32 tensor's `neg_()` does) unseen. Faster than a blake2b of a
    copy of the checksums, at every store of a cache of GBs (docs/PERFORMANCE.md)."""
    one, two = _terms(sums, np.arange(len(sums), dtype=np.uint64))
    return int(one).to_bytes(8, "little") + int(two).to_bytes(8, "little")


def moved_key(key: bytes, before: np.ndarray, after: np.ndarray, pieces: np.ndarray) -> bytes:
    """sums_key of an array whose key was `key` and whose rows `pieces` were `before` and are
    `after` now: each sum less those rows' old terms, plus their new ones, modulo 2^64."""
    places = pieces.astype(np.uint64)
    (old_one, old_two), (new_one, new_two) = _terms(before, places), _terms(after, places)
    one = (int.from_bytes(key[:8], "little") - old_one + new_one) % _WORDS
    two = (int.from_bytes(key[8:16], "little") - old_two + new_two) % _WORDS
    return one.to_bytes(8, "little") + two.to_bytes(8, "little")


_WORDS = 1 << 64


_FEW_TERMS = 8  # up to this many pieces, their terms in Python's ints: numpy's fixed cost a call is more
_MASK = _WORDS - 1
_K = [int(k) for k in _MULTIPLIERS]


def _terms(sums: np.ndarray, places: np.ndarray) -> tuple[int, int]:
    """The sums, modulo 2^64, of the two terms of each piece of `sums` (rows of two checksums) at
    its place (`places`, uint64)."""
    if len(places) <= _FEW_TERMS:  # a decode step's changed pieces: ~10 us against ~50 in numpy
        return _terms_of_few(sums, places)
    words = sums.view(np.uint64)
    k = _MULTIPLIERS
    with np.errstate(over="ignore"):  # arithmetic modulo 2^64 is the point
        first = _mixed(words[:, 0] ^ (places * k[0]))
        second = _mixed(words[:, 1] ^ (places * k[1]))
        one = _mixed(first ^ (second * k[2]))
        two = _mixed(second ^ (first * k[3]))
        return int(one.sum(dtype=np.uint64)), int(two.sum(dtype=np.uint64))


def _terms_of_few(sums: np.ndarray, places: np.ndarray) -> tuple[int, int]:
    """_terms in Python's ints, the same bits: each value masked to its 64 bits (an int64's
    two's complement is its uint64 view), every product reduced modulo 2^64."""
    one = two = 0
    for (a, b), place in zip(sums.tolist(), places.tolist()):
        first = _mixed_int((a & _MASK) ^ (place * _K[0] & _MASK))
        second = _mixed_int((b & _MASK) ^ (place * _K[1] & _MASK))
        one += _mixed_int(first ^ (second * _K[2] & _MASK))
        two += _mixed_int(second ^ (first * _K[3] & _MASK))
    return one & _MASK, two & _MASK


def _mixed_int(x: int) -> int:
    """_mixed of one 64-bit word."""
    x ^= x >> _SHIFT_BITS[0]
    x = x * _K[4] & _MASK
    x ^= x >> _SHIFT_BITS[1]
    x = x * _K[5] & _MASK
    return x ^ x >> _SHIFT_BITS[2]


def _mixed(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, in place on `x` (a fresh array)."""
    x ^= x >> _SHIFTS[0]
    x *= _MULTIPLIERS[4]
    x ^= x >> _SHIFTS[1]
    x *= _MULTIPLIERS[5]
    x ^= x >> _SHIFTS[2]
    return x


class _Hold:
    """Staged device bytes counted against the budget, and their buffer, given back once: when a
    writer is done with their store, or when the store is dropped unwritten (its history, the one
    holder, goes: a weakref.finalize a store cost the program's thread more)."""
    __slots__ = ("_nbytes", "_give_back", "_give_buffer")

    def __init__(self, nbytes: int, give_back: Callable[[int], None], give_buffer: Callable[[], None]):
        self._nbytes, self._give_back, self._give_buffer = nbytes, give_back, give_buffer

    def give_back(self) -> None:
        nbytes, self._nbytes = self._nbytes, 0
        give_buffer, self._give_buffer = self._give_buffer, nothing  # it holds the buffer: let go of it
        if nbytes:  # kept before the bytes count as let go: a store waiting for room then finds it
            give_buffer()
            self._give_back(nbytes)

    __del__ = give_back


@dataclass(frozen=True, slots=True)
class _Run:
    """The bytes of a tensor's storage span, by address (no view made: a torch operator on the
    program's thread waits for the interpreter lock beside the writers), and the tensor that
    keeps them alive."""
    owner: torch.Tensor
    address: int
    nbytes: int

    def copy_into(self, target: torch.Tensor) -> None:
        """Copy the run into the start of `target` (uint8, on its device), on the current stream."""
        runtime = cuda_runtime.on_current_device(target.device)
        if runtime is not None:
            stream = runtime.current_stream(target.device.index)
            runtime.copy_on_device(target.data_ptr(), self.address, self.nbytes, stream)
            return
        target[:self.nbytes].copy_(self._bytes())

    def copy_to_host(self, target: torch.Tensor) -> None:
        """Copy the run into the start of `target` (host memory the device writes: pinned on a GPU)
        on the current stream, and wait for it."""
        runtime = cuda_runtime.on_current_device(self.owner.device)
        if runtime is not None:
            stream = runtime.current_stream(self.owner.device.index)
            runtime.copy_to_host(target.data_ptr(), self.address, self.nbytes, stream)
            runtime.synchronize(stream)
            return
        target[:self.nbytes].copy_(self._bytes())

    def _bytes(self) -> torch.Tensor:
        """The run as a view of bytes, through torch (the interpreter's memory, or another device's
        than the current): it starts at the owner's first element."""
        span = torch.as_strided(self.owner.detach(), (self.nbytes // self.owner.element_size(),), (1,),
                                self.owner.storage_offset())
        return span.view(torch.uint8)


def _run(t: torch.Tensor, geometry: Geometry | None) -> _Run | None:
    """`t`'s storage span (`geometry`: t's, where the caller has it) where its pieces are
    checksummed; None where not."""
    if t.device.type not in DEVICES:
        return None
    run = _Run(t, t.data_ptr(), (geometry or geometry_of(t)).span * t.element_size())
    return run if sums_kernel().trackable(run.address, run.nbytes) else None


def _whole_on_overflow(history: PieceHistory, run: _Run
                       ) -> Callable[[Callable[[int], torch.Tensor], Callable[[torch.Tensor], None]], None]:
    """What a packed store's launch calls where its changed pieces did not fit its room
    (PieceHistory.take_whole), holding the store weakly: a store dropped unwritten goes as before."""
    held = weakref.ref(history)

    def overflowed(take: Callable[[int], torch.Tensor], give: Callable[[torch.Tensor], None]) -> None:
        history = held()
        if history is not None:
            history.take_whole(run, take, give)
    return overflowed


def staging_buffer(nbytes: int, device: torch.device) -> torch.Tensor:
    """Device memory the recording stages in (the changed pieces of a store, whole pieces; the
    checksums later stores compare with; output buffers held over their call), as bytes."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def after_plan(known: Known | None, resolved: list[str | None], alike: dict[int, int]) -> Known:
    """What a plan leaves known of a store (`resolved`, its unknown places the keys of `alike`),
    with what `known` said of the store before; `resolved` is its own (plan() made it), for the
    digests to be filled in place."""
    if known is None:
        return Known(resolved, list(alike), owned=True)
    return Known(resolved, list(alike), known.fresh, known.listed, owned=True)


def in_order(pieces: int) -> dict[int, int]:
    """Slots of a store held whole: piece n at n."""
    return dict(zip(range(pieces), range(pieces)))


def consecutive_runs(pieces: list[int]) -> list[tuple[int, int]]:
    """Ascending piece numbers as runs of consecutive ones, [start, end)."""
    runs: list[tuple[int, int]] = []
    for n in pieces:
        if runs and runs[-1][1] == n:
            runs[-1] = (runs[-1][0], n + 1)
        else:
            runs.append((n, n + 1))
    return runs


class PieceTracker:
    """The last store's checksums of each tracked memory region, to flag what changed since, what
    the recording stored by checksums, and the device memory held by staged pieces not yet fetched."""

    def __init__(self, wait_for_room: bool = True) -> None:
        self._last: dict[tuple[torch.device, int, int], PieceHistory] = {}
        self.recorded = KnownContent()
        self.wait_for_room = wait_for_room
        # called before the program waits for room: hands the calls made so far to the writers
        # (pipeline.CallWriter.hand_off), which give the room back as they fetch their pieces
        self.before_waiting: Callable[[], None] = nothing
        self._staged_bytes = 0
        self._in_making = 0  # of those, held by calls not yet handed to the writers
        self._waited_in_vain = False
        # re-entrant: a garbage collection inside it may finalize a history that gives staged bytes back
        self._lock = threading.RLock()
        self._room = threading.Condition(self._lock)
        # device buffers kept for reuse (staged pieces, the recorder's scratch); a fresh one from staging_buffer
        # (looked up at each use: tests replace it), kept while they and the staged stores fit the budget
        self.buffers = DeviceBuffers(lambda nbytes, device: staging_buffer(nbytes, device), DEVICE_STAGING_BYTES,
                                     held=lambda: self._staged_bytes)

    def observe(self, t: torch.Tensor, stage: bool, batch: PieceBatch, clone: bool = False,
                geometry: Geometry | None = None) -> PieceHistory | None:
        """A store of `t`'s storage span (`geometry`: t's, where the caller has it) now,
        checksummed in `batch`'s launch: None where it is not tracked. With `stage`, the changed
        pieces are copied on the device (PieceHistory.staged), where they lie or, where the whole
        store would pass DEVICE_STAGING_BYTES (after waiting a while for the writers, in a
        blocking recording), packed into a room of PACKED_ROOM_BYTES; where there is no room for
        either, or the device has none, the caller copies the span to the host. With `clone` (a
        store before a call that may change the span), a store staged whole copies every piece
        aside now and the launch, after the call, reads that copy."""
        run = _run(t, geometry)
        if run is None:
            return None
        key = (t.device, run.address, run.nbytes)
        last = self._last.get(key)
        if last is not None and last.cloned and batch.pending(last.place):
            # its copy aside waits for the same launch: compare with what it compares with, not with it
            last = last.previous
        if last is not None and last.failed:  # its pieces were never written: compare with nothing
            last = None
        history = self._add(batch, run, t.device, last, stage, staged_only=False, clone=clone)
        assert history is not None
        history.memory = key
        with self._lock:  # the memory stored last moves to the end; past MEMORIES_KEPT the oldest is forgotten
            replaced = self._last.pop(key, None)
            self._last[key] = history
            forgotten = self._last.pop(next(iter(self._last))) if len(self._last) > MEMORIES_KEPT else None
        # let go here, not under the lock: a history dropped unwritten gives its staged bytes back (_let_go)
        del replaced, forgotten
        return history

    def observe_blob(self, t: torch.Tensor, batch: PieceBatch, clone: bool = False,
                     geometry: Geometry | None = None) -> PieceHistory | None:
        """A store of a read-only tensor's span to be kept as a blob, checksummed in `batch`'s
        launch and copied whole aside on the device (PieceHistory.staged; with `clone`, now, the
        launch reading the copy), to come over only if the recording never stored those bytes.
        None where it is not tracked, or there is no room to stage it: the caller copies the span
        to the host."""
        run = _run(t, geometry)
        if run is None or run.nbytes < DEVICE_BLOB_BYTES:
            return None
        return self._add(batch, run, t.device, None, True, staged_only=True, clone=clone)

    def _add(self, batch: PieceBatch, run: _Run, device: torch.device, last: PieceHistory | None, stage: bool,
             staged_only: bool, clone: bool) -> PieceHistory | None:
        """`run` and its history added to `batch`, its changed pieces staged where there is room
        (with `clone`, all of them now, the row reading that copy); with `staged_only`, nothing
        where the store cannot be staged."""
        if last is not None and not batch.comparable(last.place):
            last = None
        nbytes = run.nbytes
        padded = -(-nbytes // CHUNK_BYTES) * CHUNK_BYTES  # whole pieces (the last one's tail stays unwritten)
        room = 0
        if stage and not self._reserve(padded):
            room = self._packed_room(padded, staged_only)
            stage = room > 0
        size = room * CHUNK_BYTES or padded
        staged: torch.Tensor | None = None
        give_staged: Callable[[], None] = nothing
        if stage:
            try:
                staged, give_staged = self.buffers.take(size, device)
            except torch.cuda.OutOfMemoryError:  # no room to stage: the program's memory comes first
                self._unreserve(size)
        if staged_only and staged is None:
            return None
        cloned = clone and staged is not None and not room and nbytes <= CLONE_BYTES  # packed: summed in place
        compared = last.place if last is not None else None
        try:
            if cloned:
                assert staged is not None
                run.copy_into(staged)  # on the program's stream, before its call: what the launch after it reads
                place = batch.add(staged.data_ptr(), nbytes, staged, compared, None, live=False)
            else:
                place = batch.add(run.address, nbytes, run.owner, compared, staged, room=room)
        except BaseException:
            if staged is not None:
                self._unreserve(size)
            raise
        history = PieceHistory(last, place, last is not None, self.recorded, staged, nbytes, cloned,
                               _let_go=self._let_go, give_staged=give_staged)
        if place.room:
            place.overflowed = _whole_on_overflow(history, run)
        return history

    def _packed_room(self, padded: int, whole_only: bool) -> int:
        """The pieces of a packed room, reserved, for a store of `padded` bytes that found no room to
        stage whole; 0 where it must be whole (`whole_only`: a blob) or the room would be all of
        it, or there is none. A first store (every piece new) is packed too: a cache of zeros
        stages none of its pieces. A store before its call that would have been copied aside
        whole is summed in place instead, before the call."""
        room = min(padded, PACKED_ROOM_BYTES)
        if whole_only or room >= padded or not self._reserve(room):
            return 0
        return room // CHUNK_BYTES

    def _reserve(self, padded: int) -> bool:
        """Room for `padded` staged bytes, counted as in the making: past the budget, wait for the
        writers to let go of staged stores, as for a full queue (a host copy instead would cost the
        program more), but never for calls still being made; False where there is none."""
        if self.wait_for_room and self._staged_bytes + padded > DEVICE_STAGING_BYTES:  # may wait: outside the lock
            self.before_waiting()
        with self._room:
            deadline = time.monotonic() + STAGING_WAIT_S
            while (self.wait_for_room and padded <= DEVICE_STAGING_BYTES and not self._waited_in_vain
                   and self._staged_bytes + padded > DEVICE_STAGING_BYTES and self._staged_bytes > self._in_making):
                if not self._room.wait(deadline - time.monotonic()):
                    self._waited_in_vain = True  # then the host copy, as past the budget without waiting
            if self._staged_bytes + padded > DEVICE_STAGING_BYTES:
                return False
            self._staged_bytes += padded
            self._in_making += padded
            return True

    def _unreserve(self, nbytes: int) -> None:
        """A reservation no store took."""
        self.handed_over(nbytes)
        self._let_go(nbytes)

    @property
    def known_pieces(self) -> int:
        """Pieces known now by their checksums (at most SEEN_PIECES, and one store's more)."""
        return len(self.recorded.pieces)

    @property
    def staged_bytes(self) -> int:
        """Device memory held now by staged pieces no writer has fetched."""
        return self._staged_bytes

    def handed_over(self, nbytes: int) -> None:
        """`nbytes` of staged stores are no longer in the making: their call went to the writers, or
        was dropped, or the store failed."""
        with self._room:
            self._in_making -= nbytes
            self._room.notify_all()

    def _let_go(self, nbytes: int) -> None:
        with self._room:
            self._staged_bytes -= nbytes
            self._waited_in_vain = False
            self._room.notify_all()

    def is_last(self, history: PieceHistory) -> bool:
        """Whether `history` is the last store of its memory: the next store compares with it."""
        with self._lock:
            return history.memory is not None and self._last.get(history.memory) is history

    def restart(self) -> None:
        """Let go of every memory's last store: the next store of each compares with nothing."""
        with self._lock:
            last, self._last = self._last, {}
        del last  # outside the lock, as in observe()

    def forget(self) -> None:
        """The recording is over: let go of the device checksums (the writers still finish theirs)."""
        self.restart()
        self.buffers.close()
