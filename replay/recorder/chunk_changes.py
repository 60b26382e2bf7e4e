"""Which 64 KiB pieces of a large tensor changed since it was last stored, decided on the GPU.

A KV cache that a decode step writes 64 KiB of is stored in content-addressed pieces (format 3);
hashing every piece of it on the host at every call costs far more than the step. So, where the
tensor lives on a GPU, a checksum of each piece is computed there (stream-ordered torch kernels:
no synchronisation) and compared with the checksums of the last tensor stored from the same
memory; the flags of the pieces that differ travel to the host with the tensor's bytes, and the
writer hashes only those, taking the others' sha256 from that last store. Correctness rests on
the checksums alone, not on the memory being the same tensor: equal checksums mean equal bytes
(two sums of the piece's 32-bit words under random 64-bit weights, wrapping: a change is missed
with odds about 2^-128), so a piece named by a reused digest holds what the digest says.

On the CPU the host does the work either way and sha256 is as fast as the checksum, so only
CUDA tensors are tracked (DEVICES).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from replay.snapshot.writer import CHUNK_BYTES

DEVICES = ("cuda",)  # where pieces are checksummed; tests add "cpu" to run the same logic there
SLICE_PIECES = 256  # pieces summed at once: bounds the temporary int64 copy to 8x their 16 MiB
_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def _weights(device: torch.device) -> torch.Tensor:
    """Two rows of random 64-bit weights, one per 32-bit word of a piece (fixed seed: reproducible)."""
    weights = _WEIGHTS.get(device)
    if weights is None:
        gen = torch.Generator().manual_seed(0x5EED)
        weights = torch.randint(-(1 << 62), 1 << 62, (2, CHUNK_BYTES // 4), generator=gen, dtype=torch.int64)
        weights = _WEIGHTS[device] = weights.to(device)
    return weights


def piece_checksums(raw: torch.Tensor) -> torch.Tensor:
    """[pieces, 2] int64 checksums of a run of bytes (uint8, 1-D) cut into CHUNK_BYTES pieces,
    the last one zero-padded, computed on the bytes' device."""
    pieces = -(-raw.numel() // CHUNK_BYTES)
    weights = _weights(raw.device)
    sums = torch.empty(pieces, 2, dtype=torch.int64, device=raw.device)
    whole = raw.numel() // CHUNK_BYTES
    for start in range(0, pieces, SLICE_PIECES):
        end = min(start + SLICE_PIECES, pieces)
        if end <= whole:
            block = raw[start * CHUNK_BYTES:end * CHUNK_BYTES]
        else:  # the last, partial piece: padded with zeros to a whole one
            block = torch.zeros((end - start) * CHUNK_BYTES, dtype=torch.uint8, device=raw.device)
            block[:raw.numel() - start * CHUNK_BYTES] = raw[start * CHUNK_BYTES:]
        words = block.view(torch.int32).view(end - start, -1).to(torch.int64)
        sums[start:end, 0] = (words * weights[0]).sum(1)
        sums[start:end, 1] = (words * weights[1]).sum(1)
    return sums


@dataclass
class PieceHistory:
    """One store of a tracked tensor: which of its pieces differ from the store before it from the
    same memory (`changed`, on the host once the call's copies landed; None: all may), and, once
    the writer has hashed them, every piece's sha256."""
    previous: PieceHistory | None
    changed: torch.Tensor | None
    digests: list[str] | None = None
    _done: threading.Event = field(default_factory=threading.Event)

    def known(self) -> list[str | None] | None:
        """The sha256 of each piece that did not change since the store before (None where it did,
        or for all when the store before was not hashed), waiting for that store's writer."""
        previous, self.previous = self.previous, None  # the chain of stores is let go as it is written
        if previous is None or self.changed is None:
            return None
        previous._done.wait()
        before = previous.digests
        if before is None or len(before) != len(self.changed):
            return None
        return [None if changed else digest for digest, changed in zip(before, self.changed.tolist())]

    def hashed(self, digests: list[str] | None) -> None:
        """The writer is done with this store (`digests` None: it failed, or never wrote it)."""
        if not self._done.is_set():
            self.digests, self.previous = digests, None
            self._done.set()


class PieceTracker:
    """The last store's checksums of each tracked memory region, to flag what changed since."""

    def __init__(self) -> None:
        self._last: dict[tuple[torch.device, int, int], tuple[torch.Tensor, PieceHistory]] = {}

    def observe(self, span: torch.Tensor) -> PieceHistory | None:
        """A store of `span` (a contiguous storage span) now, on its stream: None where it is not tracked."""
        if span.device.type not in DEVICES:
            return None
        raw = span.reshape(-1).view(torch.uint8)
        sums = piece_checksums(raw)
        key = (span.device, raw.data_ptr(), raw.numel())
        last = self._last.get(key)
        changed = None
        if last is not None:
            flags = (sums != last[0]).any(1)
            # travels with the call's copies, whose event covers it (pinned by torch's caching host allocator)
            changed = flags.to("cpu", non_blocking=True)
        history = PieceHistory(last[1] if last is not None else None, changed)
        self._last[key] = (sums, history)
        return history

    def forget(self) -> None:
        """The recording is over: let go of the device checksums."""
        self._last.clear()
