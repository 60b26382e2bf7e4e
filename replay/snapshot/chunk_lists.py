"""Chunk lists (format 3) and their edits (format 6).

A chunk list names every piece of a tensor stored in chunks: 36 bytes a 64 KiB piece (its sha256
and the number of its pack), so 37 KB for a 64 MiB KV cache and 9.4 MB for a 16 GiB one, at every
store, where a decode step changes a piece or two. From version 6 a store may name an earlier whole
list of the same tensor (its base) and an **edit list**, a tensor of the call itself stored with
its other tensors (no file of its own): a [k, 40] U8 table whose rows are a piece's number
(uint32, little-endian) and its 36-byte row, numbers strictly increasing, each below the base's
length. A writer keeps a base a lineage (one tensor of one op) and writes edits of it while they
hold at most sqrt(2 n) rows for a list of n rows, a whole list (the lineage's new base) past that:
over a run of stores that each change one piece, the list bytes a store then average about
36 sqrt(2 n) (1.6 KB for the 64 MiB cache, 26 KB for 16 GiB) where whole lists cost 36 n. Knows
nothing of where the lists are stored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ROW = 36  # a list's row: the piece's sha256 and the number of its pack (uint32, LE)
EDIT_ROW = 4 + ROW  # an edit's row: the piece's number (uint32, LE), then its list row
EDITS_ROLE = "edits"  # an edit list's key in its call: edits/<the edited tensor's key>


@dataclass(frozen=True, eq=False)
class ChunkList:
    """How a call's geometry names a tensor's pieces: a whole list, or a base list and the edits
    (stored in the call, under edits_key) that make it this tensor's."""
    whole: str  # the digest of a whole list's blob
    edits: np.ndarray | None = None  # [k, EDIT_ROW] uint8, when the pieces are the base's edited
    # the list's rows ([n, ROW] uint8), where its writer kept them: the next list of the same memory
    # is these with its fresh rows patched (never stored: the blob and the edits are what is)
    rows: np.ndarray | None = field(default=None, repr=False)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ChunkList) or self.whole != other.whole:
            return False
        if self.edits is None or other.edits is None:
            return self.edits is other.edits
        return np.array_equal(self.edits, other.edits)

    __hash__ = None  # type: ignore[assignment]  # equal by value, an array inside: no hash

    def to_json(self, key: str) -> dict[str, Any]:
        """The geometry's fields for tensor `key`."""
        return {"chunks": self.whole, **({"chunk_edits": edits_key(key)} if self.edits is not None else {})}


def edits_key(key: str) -> str:
    """Where the edit list of tensor `key`'s chunk list is stored in its call."""
    return f"{EDITS_ROLE}/{key}"


def most_edits(rows: int) -> int:
    """The most rows an edit list of a list of `rows` rows holds before a whole list is written instead."""
    return math.isqrt(2 * rows)


def edits_between(base: np.ndarray, rows: np.ndarray) -> np.ndarray | None:
    """The edit list taking `base` ([n, ROW] uint8) to `rows` (the same shape), or None where a
    whole list is better written (another length, or more rows changed than most_edits allows).
    No rows changed: an empty [0, EDIT_ROW] table (the base is the list)."""
    if base.shape != rows.shape:
        return None
    return _edits(rows, np.flatnonzero((base != rows).any(axis=1)))


def edits_at(base: np.ndarray, rows: np.ndarray, places: list[int]) -> np.ndarray | None:
    """edits_between for `rows` that can differ from `base` only at `places` (increasing): only
    those rows are compared (a decode step's list of a cache of GBs differs from its base in a few)."""
    if base.shape != rows.shape:
        return None
    if len(places) > most_edits(len(rows)):  # the rows that differ may still be few: all compared
        return edits_between(base, rows)
    at = np.asarray(places, dtype=np.int64)
    return _edits(rows, at[(base[at] != rows[at]).any(axis=1)] if len(at) else at)


def _edits(rows: np.ndarray, changed: np.ndarray) -> np.ndarray | None:
    """The edit list of `rows` at `changed` (increasing), or None past most_edits."""
    if len(changed) > most_edits(len(rows)):
        return None
    edits = np.empty((len(changed), EDIT_ROW), dtype=np.uint8)
    edits[:, :4] = changed.astype("<u4").view(np.uint8).reshape(-1, 4)
    edits[:, 4:] = rows[changed]
    return edits


def edited_places(edits: np.ndarray) -> np.ndarray:
    """The piece numbers an edit list's rows name, in its order (int64)."""
    return np.ascontiguousarray(edits[:, :4]).view("<u4").ravel().astype(np.int64)


def apply_edits(base: bytes, edits: np.ndarray) -> bytes:
    """`base` (whole list rows, ROW bytes each) with `edits` applied; a ValueError saying what is
    wrong with an edit list that is not one of `base`."""
    if edits.dtype != np.uint8 or edits.ndim != 2 or edits.shape[1] != EDIT_ROW or edits.shape[0] == 0:
        raise ValueError(f"is not a [edits, {EDIT_ROW}] table of piece numbers and rows")
    pieces = len(base) // ROW
    numbers = edited_places(edits)
    if numbers[-1] >= pieces or (len(numbers) > 1 and bool((np.diff(numbers) <= 0).any())):
        raise ValueError(f"does not name pieces of a list of {pieces} in increasing order")
    listed = np.frombuffer(bytearray(base), dtype=np.uint8).reshape(pieces, ROW)
    listed[numbers] = edits[:, 4:]
    return listed.tobytes()
