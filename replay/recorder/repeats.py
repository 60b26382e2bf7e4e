"""The pieces of an untracked chunked store that are alike the last store of the same site.

A chunked store whose changes the device did not track (an output buffer's mask of unchanged
elements, made on the device and copied whole; any chunked store of host memory) comes to a writer
whole, and each of its pieces would be hashed. A program that repeats its steps repeats these
bytes: on an H200 the Liger block's masks took the writers ~2 ms of processor time each, three a
step, hashing 64 KiB at a time (each piece a turn at the interpreter lock the program's threads
wait for). Each site's last store (its op and tensor key) is kept, bytes and piece digests; the
next store's pieces of zeros are named as before (one pass), the others compared with the kept
store a run of consecutive pieces at a time (numpy, which lets go of the lock), and a piece whose
bytes are equal takes its digest. The bytes are compared, never assumed: the site only says
which store to compare with. On the 2-core CPU machine, a decode loop's 64 MiB host cache (32
steps, a 64 KiB row each) records in 1.31-1.32 s against 1.34-1.38 s hashing its written pieces.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from replay.recorder.chunk_changes import consecutive_runs
from replay.recorder.copies import HostCopy
from replay.snapshot import hashing
from replay.snapshot.writer import CHUNK_BYTES

# the kept stores' bytes, all sites together: an output buffer's mask is a bit an element (the
# Liger block's largest: 16 MiB), a host store's bytes are its own
KEPT_BYTES = 256 << 20

Site = tuple[str, str]  # the call's op and the tensor's key (`kept/out`, `state/cache`)


@dataclass
class _Kept:
    raw: Any  # numpy uint8 array: the store's bytes
    digests: list[str]
    buffer: torch.Tensor | None  # the pooled pinned buffer `raw` lives in, to give back when let go
    nbytes: int  # the memory held: the buffer's (a power of two), or the bytes'


class Repeats:
    """The last untracked chunked store of each site, its bytes held (`give` takes a pooled buffer
    back when one is let go), up to `max_bytes` over all sites, the least lately stored let go first.
    Shared by the writer threads: a site's store is taken out while it is compared, so no other
    thread gives its buffer back meanwhile (a store of that site made then hashes every piece)."""

    def __init__(self, give: Callable[[torch.Tensor], None], max_bytes: int = KEPT_BYTES) -> None:
        self._give, self.max_bytes = give, max_bytes
        self._kept: OrderedDict[Site, _Kept] = OrderedDict()
        self._bytes = 0
        self._closed = False  # a store written after close (a late call) keeps nothing: none would give it back
        self._lock = threading.Lock()

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    def known(self, site: Site, raw: Any) -> list[str | None]:
        """The digest of each piece of `raw` (contiguous uint8, cut every CHUNK_BYTES) that is known
        without hashing it: zeros, or alike the piece of the site's last store; None for the rest.
        Zeros are found first, in one pass over all; the rest is compared a run of consecutive
        pieces at a time (a cache filling up is compared where it is written)."""
        with self._lock:
            last = self._kept.pop(site, None)
            if last is not None:
                self._bytes -= last.nbytes
        known = hashing.known_zeros(raw, CHUNK_BYTES)
        if last is None:
            return known
        try:
            if len(last.raw) != len(raw):
                return known
            for start, end in consecutive_runs(hashing.nones(known)):
                span = slice(start * CHUNK_BYTES, end * CHUNK_BYTES)  # a run of pieces that are not zeros
                for n, same in enumerate(_pieces_alike(raw[span], last.raw[span], CHUNK_BYTES), start):
                    if same:
                        known[n] = last.digests[n]
            return known
        finally:
            self._let_go(last)

    def keep(self, site: Site, copy: HostCopy, raw: Any, digests: list[str]) -> None:
        """Keep `raw`, the bytes of host copy `copy` just stored as `digests`, as the site's last
        store, where the copy's memory can be kept: a pooled buffer (this store's now: `copy` gives
        it back no more), or memory of its own. A view into a
        buffer something else gives back (a graph replay's slab, reused by the next replay) is
        never kept: its bytes would change under the comparison."""
        buffer = copy.buffer
        if buffer is None and not copy.own_memory:
            return
        nbytes = buffer.numel() * buffer.element_size() if buffer is not None else len(raw)
        if nbytes > self.max_bytes:
            return
        let_go: list[_Kept] = []
        with self._lock:
            if self._closed:
                return
            copy.buffer = None
            replaced = self._kept.pop(site, None)
            if replaced is not None:
                self._bytes -= replaced.nbytes
                let_go.append(replaced)
            self._kept[site] = _Kept(raw, digests, buffer, nbytes)
            self._bytes += nbytes
            while self._bytes > self.max_bytes:
                _, oldest = self._kept.popitem(last=False)
                self._bytes -= oldest.nbytes
                let_go.append(oldest)
        for old in let_go:
            self._let_go(old)

    def close(self) -> None:
        """Let every kept store go (the recording is over)."""
        with self._lock:
            kept, self._kept, self._bytes, self._closed = list(self._kept.values()), OrderedDict(), 0, True
        for old in kept:
            self._let_go(old)

    def _let_go(self, kept: _Kept) -> None:
        if kept.buffer is not None:
            self._give(kept.buffer)
            kept.buffer = None


def _pieces_alike(raw: Any, last: Any, piece_bytes: int) -> list[bool]:
    """Whether each piece of `raw` holds the bytes of the same piece of `last` (as long): one pass
    over both, eight bytes at a time where they are aligned."""
    whole = len(raw) // piece_bytes
    rows, last_rows = (a[:whole * piece_bytes].reshape(whole, piece_bytes) for a in (raw, last))
    if piece_bytes % 8 == 0 and raw.ctypes.data % 8 == 0 and last.ctypes.data % 8 == 0:
        rows, last_rows = rows.view(np.uint64), last_rows.view(np.uint64)
    alike = (~np.not_equal(rows, last_rows).any(axis=1)).tolist() if whole else []
    if len(raw) > whole * piece_bytes:
        alike.append(bool(np.array_equal(raw[whole * piece_bytes:], last[whole * piece_bytes:])))
    return alike
