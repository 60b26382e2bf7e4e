"""A chunked tensor's pieces into packs (format 3): the new pieces of a store written as one file.

A piece is named by the sha256 of its blob form. Each piece lives in exactly one pack of the
snapshot: a store claims the pieces no store claimed before (under the lock, before writing), and
one that finds a piece claimed by a pack still being written waits for that pack before its own
call may be indexed. (Cutting a large store into packs hashed and written side by side on the
hashing pool was measured slower on the H100 machines, not faster: docs/PERFORMANCE.md.)
"""
from __future__ import annotations

import errno
import struct
import threading
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from replay.snapshot import callfile, hashing
from replay.snapshot.chunk_lists import ROW

PACKS_DIR = "packs"
_NEVER_WRITTEN = "a piece known from an earlier store of this tensor was never written"


def pack_relpath(number: int) -> str:
    return f"{PACKS_DIR}/{number:08d}.safetensors"


class PiecePacks:
    """Where each piece of a snapshot lives, and the packs being written; safe to share between
    threads. `write(path, parts)` writes a file whole."""

    def __init__(self, path: Path, write: Callable[[Path, Sequence[Any]], None]):
        self.path, self._write = path, write
        self._lock = threading.Lock()
        self._homes: dict[str, bytes] = {}  # a piece's digest -> the number of its pack (4 bytes, LE)
        self._rows: dict[str, bytes] = {}  # a piece's digest -> its row in a chunk list: digest, pack
        self._packs = 0  # packs numbered
        self._landing: dict[bytes, threading.Event] = {}  # packs being written, set once whole or failed
        self._failed: set[bytes] = set()

    def store(self, pieces: Sequence[Any], known: Sequence[str | None] | hashing.Known | None = None
              ) -> tuple[list[str], np.ndarray]:
        """Each piece's digest (hashed where `known` does not give it; a known piece may be None: a
        store of it wrote its bytes already), the new ones packed, and the chunk list's rows
        ([pieces, ROW] uint8: digest and pack a piece), once every pack they name is whole: the
        store before's rows with the fresh ones set, where `known` has them."""
        digests = hashing.piece_digests(pieces, known)
        fresh = known.fresh if isinstance(known, hashing.Known) else None
        landing = self._pack_new(digests, pieces, fresh)
        # a piece another store is packing right now: this call is indexed only once that pack is whole
        for landed in landing.values():
            landed.wait()
        if self._failed.intersection(landing):
            raise OSError(errno.EIO, "a pack holding some of this tensor's pieces could not be written")
        before = known.listed.rows if isinstance(known, hashing.Known) and known.listed is not None else None
        try:
            if fresh is not None and before is not None and len(before) == len(digests):
                rows = before.copy()  # the others' rows are the store before's: their digests are
                rows[fresh] = self._rows_of([digests[n] for n in fresh])
                return digests, rows
            return digests, self._rows_of(digests)
        except KeyError:  # a piece said to be in a pack already that no store wrote: never silently lost
            raise OSError(errno.EIO, _NEVER_WRITTEN) from None

    def _rows_of(self, digests: list[str]) -> np.ndarray:
        """The chunk list's rows of `digests` ([len, ROW] uint8, writable); a KeyError for a piece in no pack."""
        joined = bytearray(b"".join(map(self._rows.__getitem__, digests)))
        return np.frombuffer(joined, dtype=np.uint8).reshape(len(digests), ROW)

    def _pack_new(self, digests: list[str], pieces: Sequence[Any], fresh: list[int] | None
                  ) -> dict[bytes, threading.Event]:
        """The pieces no store claimed yet written as one pack; the packs of other stores still
        being written that hold the others. Only the `fresh` places are looked at, where given."""
        new: dict[str, Any] = {}
        packed = b""
        if fresh is not None:  # the others are the store before's, in packs already whole
            digests, pieces = [digests[n] for n in fresh], [pieces[n] for n in fresh]
        with self._lock:  # new pieces are claimed for this pack before it is written: no other packs them too
            homes = list(map(self._homes.get, digests))  # per piece: a decode step's list is long
            if None in homes:
                new = {digest: piece for digest, piece, home in zip(digests, pieces, homes) if home is None}
            if any(piece is None for piece in new.values()):  # a known piece no store wrote: never silently lost
                raise OSError(errno.EIO, _NEVER_WRITTEN)
            landing = {home: self._landing[home] for home in set(homes) if home in self._landing}
            if new:
                number, self._packs = self._packs, self._packs + 1
                packed = struct.pack("<I", number)
                self._homes.update(dict.fromkeys(new, packed))
                self._rows.update((digest, bytes.fromhex(digest) + packed) for digest in new)
                self._landing[packed] = threading.Event()
                if number == 0:
                    (self.path / PACKS_DIR).mkdir(exist_ok=True)
        if new:
            try:
                self._write(self.path / pack_relpath(number), callfile.serialize_parts(
                    None, {digest: torch.from_numpy(piece) for digest, piece in new.items()}))
            except BaseException:
                with self._lock:  # a later store packs these pieces again: no list names bytes in no file
                    self._failed.add(packed)
                    for digest in new:
                        del self._homes[digest], self._rows[digest]
                raise
            finally:
                with self._lock:
                    self._landing.pop(packed).set()
        return landing
