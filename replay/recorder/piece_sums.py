"""One kernel per store of a large tensor: each 64 KiB piece's checksums, whether the piece changed
since the last store from the same memory, and (when asked) a device-side copy of the pieces that
did, so that only those cross to the host later, off the program's stream.

A checksum is two sums of the piece's 32-bit words under random 64-bit weights (fixed seed),
wrapping modulo 2^64. A change of one word by d is missed only where d times both its weights
vanishes modulo 2^64: with the weights' low bits random, odds about 2^-(128 - 2k) where 2^k
divides d (2^-66 at worst, a float's sign bit), and less for changes of many words; negligible
beside any hardware fault. A program sums a few pieces, reading each once (and once more, to
copy it, only if it changed); the weights, 256 KiB, stay in L2 and are read once for all the
program's pieces (with a piece a program, reading the weights cost more than reading the
bytes). On the CPU the kernel runs in Triton's interpreter (tests only: there sha256 costs the
same).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from replay.snapshot.writer import CHUNK_BYTES

WORDS = CHUNK_BYTES // 4  # 32-bit words a piece
ROW = 3  # int64 values a piece: its two checksums, then whether it changed (one copy brings all to the host)
_BLOCK = 512
_GROUP = 4  # pieces a program sums: the weights, read from L2, are read once for all of them
_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def _weights(device: torch.device) -> torch.Tensor:
    """[2, WORDS] random 64-bit weights on `device`, the same on every run."""
    weights = _WEIGHTS.get(device)
    if weights is None:
        gen = torch.Generator().manual_seed(0x5EED)
        weights = torch.randint(-(1 << 62), 1 << 62, (2, WORDS), generator=gen, dtype=torch.int64)
        weights = _WEIGHTS[device] = weights.to(device)
    return weights


@triton.jit
def _piece_sums_kernel(words_ptr, nwords, pieces, weights_ptr, last_ptr, sums_ptr, staged_ptr,
                       WORDS: tl.constexpr, BLOCK: tl.constexpr, GROUP: tl.constexpr, ROW: tl.constexpr,
                       COMPARE: tl.constexpr, STAGE: tl.constexpr):
    # GROUP pieces a program: each block of weights read from cache serves them all
    piece = tl.program_id(0).to(tl.int64) * GROUP + tl.arange(0, GROUP)
    real = piece < pieces
    base = piece * WORDS
    first = tl.zeros([GROUP, BLOCK], dtype=tl.int64)
    second = tl.zeros([GROUP, BLOCK], dtype=tl.int64)
    for start in range(0, WORDS, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        at = base[:, None] + offsets[None, :]
        word = tl.load(words_ptr + at, mask=at < nwords, other=0).to(tl.int64)  # the last piece: zero-padded
        first += word * tl.load(weights_ptr + offsets)[None, :]
        second += word * tl.load(weights_ptr + WORDS + offsets)[None, :]
    sum_first = tl.sum(first, axis=1)
    sum_second = tl.sum(second, axis=1)
    tl.store(sums_ptr + ROW * piece, sum_first, mask=real)
    tl.store(sums_ptr + ROW * piece + 1, sum_second, mask=real)
    if COMPARE:
        changed = ((sum_first != tl.load(last_ptr + ROW * piece, mask=real, other=0))
                   | (sum_second != tl.load(last_ptr + ROW * piece + 1, mask=real, other=0)))
    else:
        changed = real  # nothing to compare with: every piece is new
    changed = changed & real
    tl.store(sums_ptr + ROW * piece + 2, changed.to(tl.int64), mask=real)
    if STAGE:
        for start in range(0, WORDS, BLOCK):
            at = base[:, None] + (start + tl.arange(0, BLOCK))[None, :]
            moved = changed[:, None] & (at < nwords)  # only the changed pieces are read again
            tl.store(staged_ptr + at, tl.load(words_ptr + at, mask=moved), mask=moved)


def trackable(raw: torch.Tensor) -> bool:
    """Whether a run of bytes (uint8, 1-D) can be read as 32-bit words."""
    return raw.numel() % 4 == 0 and raw.storage_offset() % 4 == 0 and raw.numel() > 0


def piece_sums(raw: torch.Tensor, last: torch.Tensor | None, stage: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """For a run of bytes (uint8, 1-D, trackable), on its stream: a [pieces, ROW] int64 table of
    each piece's two checksums and whether it differs from `last` (an earlier such table; every
    piece differs when `last` is None), and, with `stage`, a device buffer of whole pieces (int32
    words) holding the changed ones where they lie in `raw` (the others left unwritten)."""
    words = raw.view(torch.int32)
    pieces = -(-words.numel() // WORDS)
    sums = torch.empty(pieces, ROW, dtype=torch.int64, device=raw.device)
    staged = torch.empty(pieces * WORDS, dtype=torch.int32, device=raw.device) if stage else None
    _piece_sums_kernel[(-(-pieces // _GROUP),)](
        words, words.numel(), pieces, _weights(raw.device), last if last is not None else sums, sums,
        staged if staged is not None else words, WORDS=WORDS, BLOCK=_BLOCK, GROUP=_GROUP, ROW=ROW,
        COMPARE=last is not None, STAGE=stage, num_warps=8)
    return sums, staged
