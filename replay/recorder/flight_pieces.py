"""A flight recording's stores in pieces (a KV cache a decode step writes a row of), held as the
pieces each store changed, not as whole copies.

As in a full recording, a store's changed pieces are flagged and staged on the device
(chunk_changes.py). Once its launch has run (asked without waiting, each time the ring takes a
call) they come to the host and the staged device memory goes back: the ring holds a decode
step's 64 KiB, not its 64 MiB cache. A held store names its unchanged pieces by the store before
it of the same memory, which the ring may have forgotten; so when the ring forgets a store that
others still compare with, its bytes are kept whole (a base): a first store is whole already
(every piece changed), a later one takes the whole bytes of the base before it and writes its
own changed pieces in (moved where nothing else needs that base: a copy of the pieces a step
changed, not of the cache). A dump writes the bases' pieces first; the stores it holds then name
their unchanged pieces by a base's digests, as a full recording's do by the store before's. One
base a memory is live at a time in a decode loop; a base no held store compares with (its memory
stored last long ago) goes first when the ring is over its byte budget, and the next store of its
memory is then whole.
"""
from __future__ import annotations

import collections
import functools
from typing import Iterator

from replay.recorder.chunk_changes import HeldPieces, PieceHistory, PieceTracker, in_order, unmade_zeros
from replay.recorder.copies import HostCopy, PinnedPool
from replay.recorder.device_buffers import nothing
from replay.recorder.repeats import Site
from replay.snapshot.writer import CHUNK_BYTES, host_bytes

# Staged device bytes of stores whose launch has not run, past which the ring waits for the oldest
# to settle: a program that runs far ahead of its device must not stage a cache a call without end.
SETTLE_WAIT_BYTES = 1 << 30


class FlightPieces:
    """The tracked stores a flight recording's ring holds, and the bases of those it forgot.
    Called under the ring's lock (Ring), so one thread at a time."""

    def __init__(self, tracker: PieceTracker, pool: PinnedPool) -> None:
        self._tracker, self._pool = tracker, pool
        self._unsettled: collections.deque[PieceHistory] = collections.deque()
        self._unsettled_bytes = 0
        self._bases: dict[int, tuple[PieceHistory, Site]] = {}  # id(history): the base, and whose store it was
        self.nbytes = 0  # host bytes held: settled pieces of held stores, and bases

    def added(self, pending: object) -> None:
        """A call the ring took: its stores wait to settle; those that landed settle now."""
        for _, copy in _tracked(pending):
            history = copy.pieces
            assert history is not None
            if copy.on_device and history.held is None:
                self._unsettled.append(history)
                self._unsettled_bytes += history.staging_bytes
                continue
            if history.held is None:  # no room to stage it: on the host whole, the pooled buffer now the history's
                whole = host_bytes(copy.span)  # read before the buffer leaves the copy: the span is made from it
                buffer, copy.buffer = copy.buffer, None
                # bound now: a lambda here would give back the loop's last buffer, for every store of the call
                give = functools.partial(self._pool.give, buffer) if buffer is not None else nothing
                history.held = HeldPieces(whole, in_order(_pieces(history)), give_back=give)
            # else its packed room overflowed: on the host whole already (PieceHistory.take_whole)
            self.nbytes += history.held.nbytes
        self._settle_landed()

    def _settle_landed(self) -> None:
        while self._unsettled:
            history = self._unsettled[0]
            if self._unsettled_bytes <= SETTLE_WAIT_BYTES and not history.landed():
                return  # the later ones are queued behind it
            self._settle(self._unsettled.popleft())

    def _settle(self, history: PieceHistory) -> None:
        self._unsettled_bytes -= history.staging_bytes
        if history.staged is None:  # written, failed or forgotten meanwhile
            return
        try:
            history.settle(self._pool.take, self._pool.give)
        except Exception:  # said when a dump meets the store (PieceHistory.fetch)
            return
        assert history.held is not None
        self.nbytes += history.held.nbytes

    def forget(self, pending: object) -> None:
        """The ring forgets `pending`: each of its stores is kept whole as a base where a store
        compares with it, or is let go."""
        tracked = list(_tracked(pending))
        if not tracked:
            return
        pending.ready()  # type: ignore[attr-defined]  # a store copied whole must have landed to be read
        for key, copy in tracked:
            history, copy.pieces = copy.pieces, None  # handled here: the ring's discard must not fail it
            assert history is not None
            if history.staged is not None:  # still on the device: its launch has run (ready)
                self._unsettled.remove(history)
                self._settle(history)
            if history.held is not None:
                self.nbytes -= history.held.nbytes
            if history.successors or self._tracker.is_last(history):
                self._keep_whole(history, (pending.header["op"], key))  # type: ignore[attr-defined]
            else:
                self._let_go(history)

    def _keep_whole(self, history: PieceHistory, site: Site) -> None:
        """Make `history` a base: its bytes whole on the host, piece n at n."""
        held, previous, pieces = history.held, history.previous, _pieces(history)
        if held is None:  # its pieces were lost: the stores after it fail when dumped, and say so
            self._let_go(history)
            return
        if held.covers(pieces):  # every piece its own (or zeros): a first store, or one that changed all
            whole = held if held.slots == in_order(pieces) else _zeros_and(held, history.nbytes, pieces)
        else:
            before = previous.held if previous is not None and id(previous) in self._bases else None
            if previous is None or before is None:
                self._let_go(history)  # nothing whole before it (cannot happen but for a lost store)
                return
            # the base's bytes move where this store alone needs them; else they are copied
            if previous.successors == 1 and not self._tracker.is_last(previous):
                whole, previous.held = before, None
                self.nbytes -= before.nbytes
            else:
                whole = before.copy()
            held.write_into(whole, history.nbytes)
            held.give_back()
        history.held = whole
        history.compared = False  # whole: every piece is its own
        self._let_go_of_previous(history)
        self._bases[id(history)] = (history, site)
        self.nbytes += whole.nbytes

    def _let_go(self, history: PieceHistory) -> None:
        """A store no dump will write: its host bytes go back, and the base before it if nothing
        else needs that."""
        previous = history.previous
        history.hashed(None)  # failed: a store of its memory compares with nothing from now on
        if previous is not None:
            self._drop_if_unneeded(previous)

    def _let_go_of_previous(self, history: PieceHistory) -> None:
        previous = history.leave_previous()
        if previous is not None:
            self._drop_if_unneeded(previous)

    def _drop_if_unneeded(self, base: PieceHistory) -> None:
        if id(base) in self._bases and not base.successors and not self._tracker.is_last(base):
            self._drop_base(base)

    def _drop_base(self, base: PieceHistory) -> None:
        del self._bases[id(base)]
        if base.held is not None:
            self.nbytes -= base.held.nbytes
        base.hashed(None)

    def shed(self) -> bool:
        """Let go of a base no held store compares with (its memory's next store is then whole),
        the oldest first; False where there is none."""
        for base, _ in self._bases.values():
            if not base.successors:
                self._drop_base(base)
                return True
        return False

    def take(self) -> list[tuple[PieceHistory, Site]]:
        """For a dump of everything the ring holds: the bases, to be written before its calls.
        Every memory's next store compares with nothing then (whole), as the ring starts again."""
        bases, self._bases = list(self._bases.values()), {}
        self._unsettled.clear()
        self._unsettled_bytes = self.nbytes = 0
        self._tracker.restart()
        return bases


def _tracked(pending: object) -> Iterator[tuple[str, HostCopy]]:
    """A call's stores in pieces that the tracker follows (a graph replay's copies are slabs)."""
    copies: dict[str, HostCopy] = getattr(pending, "copies", {})
    return ((key, copy) for key, copy in copies.items() if copy.chunked and copy.pieces is not None)


def _pieces(history: PieceHistory) -> int:
    return -(-history.nbytes // CHUNK_BYTES)


def _zeros_and(held: HeldPieces, nbytes: int, pieces: int) -> HeldPieces:
    """A store held whole in pieces (its pieces of zeros without bytes) as one buffer, piece n at
    n: the pages of its pieces of zeros are never made (unmade_zeros), and count nothing."""
    whole = HeldPieces(unmade_zeros(pieces * CHUNK_BYTES), in_order(pieces), resident=set())
    held.write_into(whole, nbytes)
    held.give_back()
    return whole
