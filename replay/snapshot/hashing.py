"""Hashing a chunked tensor's 64 KiB pieces: each named by the sha256 of its blob form."""
from __future__ import annotations

import concurrent.futures
import itertools
import operator
import os
import threading
from typing import Any, NamedTuple, Sequence, cast

import numpy as np

from replay.snapshot import callfile
from replay.snapshot.chunk_lists import ChunkList
from replay.snapshot.files import sha256_parts

# A chunked tensor's pieces are hashed this many to a task on a shared pool: sha256 lets go of the
# interpreter lock on each 64 KiB piece, so the pool's threads hash side by side (one core hashes
# ~1.5 GB/s, well below what a step's activations need), and a task of 4 MiB keeps the per-task
# cost of the pool small beside the hashing
PIECES_PER_TASK = 64
HASHING_THREADS = min(8, os.cpu_count() or 1)
_hashing_pool: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None  # (the pid that made it, it)
_hashing_pool_lock = threading.Lock()
_zero_digests: dict[int, str] = {}  # piece length -> the digest of that many zero bytes


class Known(NamedTuple):
    """Each piece's digest where it is known without hashing (None where not), and where it is not,
    in order: a few places of a list as long as the tensor's pieces (81,920 for a cache of 5 GiB),
    which each reader would otherwise look for again, a pass over the whole list each. `fresh`,
    where given, holds every place whose digest may not be the store before's (the pieces that
    changed since; None: any may be): the others' pieces are in packs already, whole, and their
    rows in the store before's list (`listed`). `owned`: `digests` is this Known's alone, for
    piece_digests to fill in place (a copy of 81,920 entries costs ~0.1 ms); else it is copied
    first (Repeats keeps its lists for the next store)."""
    digests: list[str | None]
    unknown: list[int]
    fresh: list[int] | None = None
    listed: ChunkList | None = None  # the store before's list, with its rows where its writer kept them
    owned: bool = False


def piece_digests(pieces: Sequence[Any], known: Sequence[str | None] | Known | None = None) -> list[str]:
    """The blob digest of each piece (a numpy uint8 array), where `known` does not give it; a
    piece listed at many places as the very same array is hashed once. Pieces of zeros are best
    named by the caller first, without reading them one by one (known_zeros, or a device's
    checksums): an output buffer's mask of unchanged elements is zeros at every step."""
    if isinstance(known, Known):
        found: list[str | None] = known.digests if known.owned else list(known.digests)
        unknown = known.unknown
    else:
        found = list(known) if known is not None else [None] * len(pieces)
        unknown = nones(found)
    first = {id(pieces[n]): n for n in reversed(unknown)}  # the first place each array is listed
    hashed = dict(zip(first.values(), hash_pieces([pieces[n] for n in first.values()])))
    for n in unknown:
        found[n] = hashed[first[id(pieces[n])]]
    return cast("list[str]", found)


def nones(values: Sequence[object]) -> list[int]:
    """Where `values` holds None, found in C (a store's list of known digests is as long as its
    tensor's pieces: 81,920 for a cache of 5 GiB, a few of them new)."""
    return list(itertools.compress(itertools.count(), map(operator.is_, values, itertools.repeat(None))))


def known_zeros(raw: Any, piece_bytes: int) -> list[str | None]:
    """For `raw` (a contiguous numpy uint8 array) cut into pieces of `piece_bytes` (the last one maybe short):
    each piece's digest where it holds only zeros, else None. One pass over the bytes for all the
    pieces, which lets go of the interpreter lock (a call a piece took it back at every piece:
    a writer doing so starves the program it records)."""
    whole = len(raw) // piece_bytes
    rows = raw[:whole * piece_bytes].reshape(whole, piece_bytes)
    if piece_bytes % 8 == 0 and raw.ctypes.data % 8 == 0:
        rows = rows.view(np.uint64)  # eight bytes at a time
    written = rows.max(axis=1).tolist() if whole else []
    if len(raw) > whole * piece_bytes:
        written.append(int(raw[whole * piece_bytes:].max()))
    return [None if value else zero_digest(min(piece_bytes, len(raw) - n * piece_bytes))
            for n, value in enumerate(written)]


def zero_digest(length: int) -> str:
    """The blob digest of a piece of `length` zero bytes (the same for every piece of that length)."""
    digest = _zero_digests.get(length)
    if digest is None:
        digest = _zero_digests[length] = sha256_parts(callfile.blob_prefix(length), bytes(length))
    return digest


def hash_pieces(pieces: Sequence[Any]) -> list[str]:
    """The blob digest of each piece, hashed PIECES_PER_TASK to a task on the shared hashing pool
    when there is more than one task."""
    runs = [pieces[start:start + PIECES_PER_TASK] for start in range(0, len(pieces), PIECES_PER_TASK)]
    if len(runs) <= 1 or HASHING_THREADS <= 1:
        return hash_pieces_here(pieces)
    try:
        tasks = [pool().submit(hash_pieces_here, run) for run in runs]
    except RuntimeError:  # the interpreter is exiting (a recording closed at exit): no pool takes work
        return hash_pieces_here(pieces)
    return [digest for task in tasks for digest in task.result()]


def hash_pieces_here(pieces: Sequence[Any]) -> list[str]:
    """The blob digest of each piece, on this thread."""
    return [sha256_parts(callfile.blob_prefix(len(piece)), piece) for piece in pieces]


def pool() -> concurrent.futures.ThreadPoolExecutor:
    """The shared hashing pool (made anew in a forked child, which has none of its threads)."""
    global _hashing_pool
    with _hashing_pool_lock:
        if _hashing_pool is None or _hashing_pool[0] != os.getpid():
            _hashing_pool = (os.getpid(), concurrent.futures.ThreadPoolExecutor(HASHING_THREADS,
                                                                               thread_name_prefix="replay-hash"))
        return _hashing_pool[1]
