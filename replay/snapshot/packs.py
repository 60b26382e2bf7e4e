"""Format 3's packs read back: where each chunk lies in a pack, and a chunk's bytes, checked.

A pack is a safetensors file of 1-D uint8 tensors, each named by the sha256 of its blob form
(callfile.blob_prefix and the bytes). Its header is checked before use: bounded in size, every
entry a run of bytes named by a sha256, inside the file, none overlapping another.
"""
from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from replay.errors import SnapshotError
from replay.snapshot import callfile, schema
from replay.snapshot.files import sha256_parts

MAX_PACK_HEADER_BYTES = 64 << 20  # ~100 bytes a piece: a pack of 40 GB of 64 KiB pieces


@dataclass(frozen=True)
class PackIndex:
    path: Path
    pieces: dict[str, tuple[int, int]]  # a piece's digest -> (where its bytes start in the file, how many)


def read_pack_index(path: Path, fd: int, size: int) -> PackIndex:
    """Where each piece of the pack open as `fd` (`size` bytes) lies, from its header, checked."""
    head = os.pread(fd, 8, 0)
    (length,) = struct.unpack("<Q", head) if len(head) == 8 else (None,)
    if length is None or length > MAX_PACK_HEADER_BYTES or 8 + length > size:
        raise SnapshotError(f"{path}: not a pack: its header is cut short or larger than "
                            f"{MAX_PACK_HEADER_BYTES} bytes")
    try:
        header = schema.parse(os.pread(fd, length, 8), "document")
    except schema.SchemaError as exc:
        raise SnapshotError(f"{path}: unreadable pack header: {exc}") from None
    base, pieces = 8 + length, {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if (not isinstance(entry, dict) or not re.fullmatch(r"[0-9a-f]{64}", name) or entry.get("dtype") != "U8"
                or not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or entry.get("shape") != [offsets[1] - offsets[0]] or not 0 <= offsets[0] <= offsets[1]
                or base + offsets[1] > size):
            raise SnapshotError(f"{path}: pack entry {name[:80]!r} is not a run of bytes named by its sha256 "
                                "lying inside the file")
        pieces[name] = (base + offsets[0], offsets[1] - offsets[0])
    ranges = sorted(pieces.values())
    if any(start + count > after for (start, count), (after, _) in zip(ranges, ranges[1:])):
        # overlapping pieces would let a small pack read as many times its size
        raise SnapshotError(f"{path}: pack entries overlap")
    return PackIndex(path, pieces)


def read_piece(index: PackIndex, fd: int, size: int, digest: str, verify: bool) -> torch.Tensor:
    """Piece `digest` of the pack open as `fd`, its sha256 checked when `verify`."""
    where = index.pieces.get(digest)
    if where is None:
        raise SnapshotError(f"{index.path}: holds no chunk {digest[:12]} (a chunk list names it there)")
    start, length = where
    data = os.pread(fd, length, start) if start + length <= size else b""
    if len(data) != length:
        raise SnapshotError(f"{index.path}: chunk {digest[:12]} runs past the end of the file (truncated?)")
    if verify and sha256_parts(callfile.blob_prefix(length), data) != digest:
        raise SnapshotError(f"{index.path}: chunk {digest[:12]}: sha256 mismatch (corrupt or tampered)")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if length else torch.empty(0, dtype=torch.uint8)
